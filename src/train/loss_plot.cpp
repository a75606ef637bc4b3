// SVG loss curves (see loss_plot.h).
#include "loss_plot.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <vector>

#include "nsa/error.h"

namespace nsa {

void write_loss_plot(const std::string& metrics_path, const std::string& svg_path) {
  std::ifstream in(metrics_path);
  NSA_CHECK(in, "cannot read metrics file '", metrics_path, "'");
  std::vector<std::pair<double, double>> train, val;
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    try {
      const auto j = nlohmann::json::parse(line);
      const double step = j.at("step").get<double>();
      train.emplace_back(step, j.at("loss").get<double>());
      if (j.contains("val_loss")) val.emplace_back(step, j.at("val_loss").get<double>());
    } catch (const std::exception&) {
      throw Error(str("metrics file '", metrics_path,
                      "' has a line that is not a step record: ", line.substr(0, 80)));
    }
  }
  NSA_CHECK(!train.empty(), "metrics file '", metrics_path, "' holds no steps");
  double x1 = 1, y0 = INFINITY, y1 = -INFINITY;
  for (const auto* series : {&train, &val}) {
    for (const auto& [s, l] : *series)
      x1 = std::max(x1, s), y0 = std::min(y0, l), y1 = std::max(y1, l);
  }
  if (y1 - y0 < 1e-9) y1 = y0 + 1;
  const double W = 720, Hh = 420, L = 60, R = 20, T = 30, B = 50;
  auto px = [&](double s) { return L + (W - L - R) * s / x1; };
  auto py = [&](double l) { return T + (Hh - T - B) * (y1 - l) / (y1 - y0); };
  std::ofstream out(svg_path);
  NSA_CHECK(out, "cannot write '", svg_path, "'");
  out << "<svg xmlns='http://www.w3.org/2000/svg' width='" << W << "' height='" << Hh
      << "' font-family='sans-serif' font-size='12'>\n<rect width='100%' height='100%' "
         "fill='white'/>\n";
  out << "<line x1='" << L << "' y1='" << Hh - B << "' x2='" << W - R << "' y2='" << Hh - B
      << "' stroke='black'/>\n<line x1='" << L << "' y1='" << T << "' x2='" << L << "' y2='"
      << Hh - B << "' stroke='black'/>\n";
  for (int k = 0; k <= 4; ++k) {
    const double l = y0 + (y1 - y0) * k / 4, s = x1 * k / 4;
    out << "<text x='" << L - 6 << "' y='" << py(l) + 4 << "' text-anchor='end'>"
        << std::round(l * 100) / 100 << "</text>\n";
    out << "<text x='" << px(s) << "' y='" << Hh - B + 18 << "' text-anchor='middle'>"
        << std::round(s) << "</text>\n";
  }
  out << "<text x='" << (L + W - R) / 2 << "' y='" << Hh - 10
      << "' text-anchor='middle'>step</text>\n<text x='14' y='" << (T + Hh - B) / 2
      << "' transform='rotate(-90 14 " << (T + Hh - B) / 2
      << ")' text-anchor='middle'>loss (nats)</text>\n";
  out << "<polyline fill='none' stroke='#1f77b4' stroke-width='1.5' points='";
  for (const auto& [s, l] : train) out << px(s) << "," << py(l) << " ";
  out << "'/>\n";
  for (const auto& [s, l] : val) {
    out << "<circle cx='" << px(s) << "' cy='" << py(l) << "' r='4' fill='#d62728'/>\n";
  }
  out << "<text x='" << W - R - 150 << "' y='" << T << "' fill='#1f77b4'>train loss</text>\n"
      << "<text x='" << W - R - 150 << "' y='" << T + 16
      << "' fill='#d62728'>validation loss</text>\n"
      << "</svg>\n";
}

}  // namespace nsa
