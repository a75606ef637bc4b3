// SVG line charts (see svg_plot.h).
#include "svg_plot.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <sstream>

#include "nsa/error.h"

namespace nsa {
namespace {

constexpr const char* kPalette[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e",
                                    "#9467bd", "#8c564b", "#e377c2", "#7f7f7f"};
constexpr int kPaletteSize = sizeof(kPalette) / sizeof(kPalette[0]);

const char* color_of(int i) {
  return kPalette[((i % kPaletteSize) + kPaletteSize) % kPaletteSize];
}

std::string escaped(const std::string& text) {
  std::string out;
  for (char c : text) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '\'':
        out += "&apos;";
        break;
      case '"':
        out += "&quot;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

// Tick labels: positions as 512, 1k, 64k; other values with enough decimals that ticks `step`
// apart read differently (at least 2); a value of a million or more (a diverged run's loss) in
// three significant digits with an exponent, not hundreds of digits.
std::string tick_text(double v, bool positions, double step = 1) {
  std::ostringstream s;
  if (positions && v >= 1024 && std::fmod(v, 1024) == 0) {
    s << v / 1024 << "k";
  } else if (positions) {
    s << std::round(v);
  } else if (std::fabs(v) >= 1e6) {
    s.precision(3);
    s << v;
  } else {
    const int decimals = std::clamp(static_cast<int>(std::ceil(-std::log10(step))) + 1, 2, 8);
    s.setf(std::ios::fixed);
    s.precision(decimals);
    s << v;
  }
  return s.str();
}

}  // namespace

void write_svg_plot(const Plot& plot, const std::string& path) {
  double x_lo = INFINITY, x_hi = -INFINITY, y_lo = INFINITY, y_hi = -INFINITY;
  for (const PlotSeries& s : plot.series) {
    for (const auto& [x, y] : s.points) {
      NSA_CHECK(!plot.log2_x || x > 0, "plot '", path, "': x = ", x,
                " cannot be drawn on a log2 axis (x must be > 0)");
      x_lo = std::min(x_lo, x), x_hi = std::max(x_hi, x);
      y_lo = std::min(y_lo, y), y_hi = std::max(y_hi, y);
    }
  }
  NSA_CHECK(std::isfinite(x_lo) && std::isfinite(y_lo), "plot '", path, "' has no points to draw");
  if (y_hi - y_lo < 1e-9) y_hi = y_lo + 1;
  const double y_pad = 0.04 * (y_hi - y_lo);
  y_lo -= y_pad, y_hi += y_pad;
  // x: linear from 0, or log2 between the powers of two around the data.
  double a0 = 0, a1 = std::max(x_hi, 1.0);
  if (plot.log2_x) {
    a0 = std::floor(std::log2(x_lo)), a1 = std::ceil(std::log2(x_hi));
    if (a1 <= a0) a1 = a0 + 1;
  }
  const double W = 760, Hh = 440, L = 64, R = 20, T = 36, B = 52;
  auto px = [&](double x) {
    const double u = plot.log2_x ? std::log2(x) : x;
    return L + (W - L - R) * (u - a0) / (a1 - a0);
  };
  auto py = [&](double y) { return T + (Hh - T - B) * (y_hi - y) / (y_hi - y_lo); };

  std::ostringstream out;
  out << "<svg xmlns='http://www.w3.org/2000/svg' width='" << W << "' height='" << Hh
      << "' font-family='sans-serif' font-size='12'>\n<rect width='100%' height='100%' "
         "fill='white'/>\n";
  if (!plot.title.empty()) {
    out << "<text x='" << (L + W - R) / 2 << "' y='20' text-anchor='middle' font-size='14'>"
        << escaped(plot.title) << "</text>\n";
  }
  out << "<line x1='" << L << "' y1='" << Hh - B << "' x2='" << W - R << "' y2='" << Hh - B
      << "' stroke='black'/>\n<line x1='" << L << "' y1='" << T << "' x2='" << L << "' y2='"
      << Hh - B << "' stroke='black'/>\n";
  for (int k = 0; k <= 4; ++k) {
    const double y = y_lo + (y_hi - y_lo) * k / 4;
    out << "<text x='" << L - 6 << "' y='" << py(y) + 4 << "' text-anchor='end'>"
        << tick_text(y, false, (y_hi - y_lo) / 4) << "</text>\n";
  }
  std::vector<double> x_ticks;
  if (plot.log2_x) {
    const int span = static_cast<int>(a1 - a0), every = std::max(1, (span + 9) / 10);
    for (int e = static_cast<int>(a0); e <= static_cast<int>(a1); e += every)
      x_ticks.push_back(std::exp2(e));
  } else {
    for (int k = 0; k <= 4; ++k) x_ticks.push_back(a1 * k / 4);
  }
  for (double x : x_ticks) {
    out << "<text x='" << px(x) << "' y='" << Hh - B + 18 << "' text-anchor='middle'>"
        << tick_text(x, true) << "</text>\n";
  }
  out << "<text x='" << (L + W - R) / 2 << "' y='" << Hh - 12 << "' text-anchor='middle'>"
      << escaped(plot.x_label) << "</text>\n<text x='14' y='" << (T + Hh - B) / 2
      << "' transform='rotate(-90 14 " << (T + Hh - B) / 2 << ")' text-anchor='middle'>"
      << escaped(plot.y_label) << "</text>\n";
  for (const PlotMark& m : plot.x_marks) {
    if (plot.log2_x && m.x <= 0) continue;
    const double x = px(m.x);
    if (x < L || x > W - R) continue;
    out << "<line x1='" << x << "' y1='" << T << "' x2='" << x << "' y2='" << Hh - B
        << "' stroke='#888' stroke-dasharray='4 3'/>\n<text x='" << x + 4 << "' y='" << T + 12
        << "' fill='#555'>" << escaped(m.label) << "</text>\n";
  }
  int legend = 0;
  for (const PlotSeries& s : plot.series) {
    const char* color = color_of(s.color);
    if (s.line && s.points.size() > 1) {
      out << "<polyline fill='none' stroke='" << color << "' stroke-width='"
          << (s.faint ? "1' stroke-opacity='0.45" : "1.8") << "' points='";
      for (const auto& [x, y] : s.points) out << px(x) << "," << py(y) << " ";
      out << "'/>\n";
    }
    if (s.markers) {
      for (const auto& [x, y] : s.points)
        out << "<circle cx='" << px(x) << "' cy='" << py(y) << "' r='4' fill='" << color << "'/>\n";
    }
    if (!s.label.empty()) {
      out << "<text x='" << W - R - 8 << "' y='" << T + 14 + 16 * legend++
          << "' text-anchor='end' fill='" << color << "'>" << escaped(s.label) << "</text>\n";
    }
  }
  out << "</svg>\n";
  std::ofstream file(path);
  NSA_CHECK(file, "cannot write the plot '", path, "'");
  file << out.str();
  file.close();
  NSA_CHECK(file, "writing the plot '", path, "' failed");
}

}  // namespace nsa
