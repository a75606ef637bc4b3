// The subcommands of the one `nsa` binary; each apps/cmd_*.cpp registers one.
#pragma once

#include <CLI/CLI.hpp>

#include <string>
#include <vector>

namespace nsa::app {

// The process's own argv, for subcommands that re-launch themselves (`nsa train --nproc N`).
const std::vector<std::string>& command_line();

void register_attention_command(CLI::App& app);
void register_inspect_command(CLI::App& app);
void register_bench_command(CLI::App& app);
void register_prepare_command(CLI::App& app);
void register_train_command(CLI::App& app);
void register_eval_command(CLI::App& app);
void register_plot_command(CLI::App& app);
void register_generate_command(CLI::App& app);
void register_diagnose_command(CLI::App& app);

}  // namespace nsa::app
