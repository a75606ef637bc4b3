// Loss curves (SVG, through svg_plot.h) from runs' metrics.jsonl: one run's training loss per step
// as a line and its validation loss as points (`nsa plot RUN`, the end of `nsa train`), or several
// runs' curves on one chart, one colour per run (`nsa plot --compare`).
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace nsa {

struct LossCurves {
  std::vector<std::pair<double, double>> train, val;  // (step, loss)
};

// The curves of metrics_path; throws nsa::Error naming the file when it holds no steps or a line
// that is not a step record.
LossCurves read_loss_curves(const std::string& metrics_path);

// Reads metrics_path, writes svg_path.
void write_loss_plot(const std::string& metrics_path, const std::string& svg_path);

// Every run's training loss (faint line) and validation loss (line with points), labelled.
void write_loss_curves_comparison(const std::vector<std::string>& labels,
                                  const std::vector<LossCurves>& curves,
                                  const std::string& svg_path);

}  // namespace nsa
