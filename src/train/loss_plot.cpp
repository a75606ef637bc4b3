// Loss curves (see loss_plot.h).
#include "loss_plot.h"

#include <fstream>
#include <nlohmann/json.hpp>

#include "nsa/error.h"
#include "svg_plot.h"

namespace nsa {

LossCurves read_loss_curves(const std::string& metrics_path) {
  std::ifstream in(metrics_path);
  NSA_CHECK(in, "cannot read metrics file '", metrics_path, "'");
  LossCurves c;
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    try {
      const auto j = nlohmann::json::parse(line);
      const double step = j.at("step").get<double>();
      // null: a value that was not finite (a diverging step) – no point on the curve.
      if (!j.at("loss").is_null()) c.train.emplace_back(step, j.at("loss").get<double>());
      if (j.contains("val_loss") && !j.at("val_loss").is_null())
        c.val.emplace_back(step, j.at("val_loss").get<double>());
    } catch (const std::exception&) {
      throw Error(str("metrics file '", metrics_path,
                      "' has a line that is not a step record: ", line.substr(0, 80)));
    }
  }
  NSA_CHECK(!c.train.empty(), "metrics file '", metrics_path, "' holds no steps");
  return c;
}

void write_loss_plot(const std::string& metrics_path, const std::string& svg_path) {
  const LossCurves c = read_loss_curves(metrics_path);
  Plot plot;
  plot.x_label = "step";
  plot.y_label = "loss (nats)";
  plot.series.push_back({"train loss", c.train, 0, true, false, false});
  plot.series.push_back({"validation loss", c.val, 1, false, true, false});
  write_svg_plot(plot, svg_path);
}

void write_loss_curves_comparison(const std::vector<std::string>& labels,
                                  const std::vector<LossCurves>& curves,
                                  const std::string& svg_path) {
  NSA_CHECK(labels.size() == curves.size(), "loss curves: ", labels.size(), " labels for ",
            curves.size(), " runs");
  Plot plot;
  plot.title = "training (faint) and validation loss";
  plot.x_label = "step";
  plot.y_label = "loss (nats)";
  for (size_t i = 0; i < curves.size(); ++i) {
    const int color = static_cast<int>(i);
    const bool has_val = !curves[i].val.empty();
    plot.series.push_back(
        {has_val ? "" : labels[i] + " (no validation)", curves[i].train, color, true, false, true});
    if (has_val) plot.series.push_back({labels[i], curves[i].val, color, true, true, false});
  }
  write_svg_plot(plot, svg_path);
}

}  // namespace nsa
