// Line charts as SVG, with no dependencies: the one drawing routine behind every plot the tools
// write – a run's loss curves (loss_plot.h), loss by token position and the comparison of several
// runs (position_loss.h, `nsa plot --compare`). Series are lines and/or markers in a fixed
// palette, with a legend; the x axis is linear from 0, or log2 (positions spanning decades).
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace nsa {

struct PlotSeries {
  std::string label;                              // legend text; empty: not in the legend
  std::vector<std::pair<double, double>> points;  // (x, y), drawn in this order
  int color = 0;                                  // palette index (wraps)
  bool line = true;                               // a polyline through the points
  bool markers = false;                           // a dot at every point
  bool faint = false;                             // thin and translucent (e.g. noisy train loss)
};

// A labelled dashed vertical line, e.g. the window w on a loss-by-position plot.
struct PlotMark {
  double x = 0;
  std::string label;
};

struct Plot {
  std::string title, x_label, y_label;
  bool log2_x = false;  // ticks at powers of two; every x must be > 0
  std::vector<PlotSeries> series;
  std::vector<PlotMark> x_marks;
};

// Writes `plot` to `path`; throws nsa::Error naming the file when it cannot be written or the
// plot holds no point (or a non-positive x on a log2 axis).
void write_svg_plot(const Plot& plot, const std::string& path);

}  // namespace nsa
