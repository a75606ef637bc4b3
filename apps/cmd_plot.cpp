// `nsa plot`: loss curves of a run as SVG (see src/train/loss_plot.h).
#include <cstdio>
#include <memory>

#include "commands.h"
#include "train/loss_plot.h"

namespace nsa::app {

void register_plot_command(CLI::App& app) {
  auto run = std::make_shared<std::string>();
  CLI::App* cmd = app.add_subcommand("plot", "Plot a run's train/validation loss (SVG)");
  cmd->add_option("run", *run, "run folder (holds metrics.jsonl)")->required();
  cmd->callback([run] {
    const std::string svg = *run + "/loss.svg";
    write_loss_plot(*run + "/metrics.jsonl", svg);
    std::printf("wrote %s\n", svg.c_str());
  });
}

}  // namespace nsa::app
