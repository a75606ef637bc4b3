// A loss-curve plot (SVG, no dependencies) from a run's metrics.jsonl: training loss per step as
// a line, validation loss as points, axes with step and loss ticks.
#pragma once

#include <string>

namespace nsa {

// Reads metrics_path, writes svg_path; throws nsa::Error naming the file when it holds no steps.
void write_loss_plot(const std::string& metrics_path, const std::string& svg_path);

}  // namespace nsa
