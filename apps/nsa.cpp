// `nsa`: the one command-line program. Subcommands live in apps/cmd_*.cpp.
//
// Every failure the user can cause (bad flag, bad file, bad config) ends here as one line on
// stderr naming the problem, and exit code 1 – whether the flag parser or the command found it,
// so that scripts see one code for every error (--help exits 0).
#include <cstdio>

#include "commands.h"
#include "nsa/error.h"

namespace nsa::app {
namespace {
std::vector<std::string> g_command_line;
}  // namespace
const std::vector<std::string>& command_line() {
  return g_command_line;
}
}  // namespace nsa::app

int main(int argc, char** argv) {
  nsa::app::g_command_line.assign(argv, argv + argc);
  CLI::App app{"nsa: Native Sparse Attention – kernels, model, training and tools"};
  app.require_subcommand(1);
  nsa::app::register_attention_command(app);
  nsa::app::register_inspect_command(app);
  nsa::app::register_bench_command(app);
  nsa::app::register_prepare_command(app);
  nsa::app::register_train_command(app);
  nsa::app::register_eval_command(app);
  nsa::app::register_plot_command(app);
  nsa::app::register_generate_command(app);
  nsa::app::register_diagnose_command(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 1;  // prints the message (or the help) and what to run next
  } catch (const std::exception& e) {
    std::fprintf(stderr, "nsa: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
