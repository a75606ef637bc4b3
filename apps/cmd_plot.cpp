// `nsa plot`: a run's loss curves as SVG (src/train/loss_plot.h), or with --compare several runs
// on one chart each: loss by token position (their loss_by_position.json from
// `nsa eval --by-position`, src/train/position_loss.h) and training/validation loss by step.
#include <cstdio>
#include <filesystem>
#include <memory>

#include "commands.h"
#include "nsa/error.h"
#include "train/loss_plot.h"
#include "train/position_loss.h"

namespace nsa::app {
namespace {
namespace fs = std::filesystem;

// --compare: runs (folders holding loss_by_position.json) or loss-by-position files.
void plot_compare(const std::vector<std::string>& args, const std::string& out) {
  NSA_CHECK(!args.empty(),
            "nsa plot --compare: name the runs to compare (run folders or "
            "loss_by_position.json files)");
  const fs::path svg(out);
  NSA_CHECK(svg.extension() == ".svg", "nsa plot --out '", out, "' must name a .svg file");
  std::vector<std::string> labels;
  std::vector<PositionLoss> runs;
  std::vector<LossCurves> curves;
  std::string no_curves;  // the first run without metrics.jsonl, if any
  for (const std::string& a : args) {
    fs::path dir(a), json(a);
    if (!dir.has_filename()) dir = dir.parent_path();  // "runs/x/"
    if (fs::is_directory(dir)) {
      json = dir / "loss_by_position.json";
      NSA_CHECK(fs::exists(json), "nsa plot --compare: run '", a,
                "' has no loss_by_position.json; write it first with nsa eval --by-position --run ",
                a, " --data DATA");
    } else {
      NSA_CHECK(fs::is_regular_file(json), "nsa plot --compare: '", a,
                "' is neither a run folder nor a loss-by-position file");
      dir = json.parent_path();
    }
    runs.push_back(read_position_loss_json(json.string()));
    labels.push_back(fs::is_directory(a) ? dir.filename().string()
                     : json.filename() == "loss_by_position.json" && dir.has_filename()
                         ? dir.filename().string()
                         : json.stem().string());
    const fs::path metrics = dir / "metrics.jsonl";
    if (fs::exists(metrics)) {
      curves.push_back(read_loss_curves(metrics.string()));
    } else if (no_curves.empty()) {
      no_curves = a;
    }
  }
  if (svg.has_parent_path()) fs::create_directories(svg.parent_path());
  write_position_loss_plot(labels, runs, svg.string());
  std::printf("wrote %s (loss by position, %zu runs)\n", svg.c_str(), runs.size());
  if (!no_curves.empty()) {
    std::printf("no loss curves: '%s' has no metrics.jsonl\n", no_curves.c_str());
    return;
  }
  const fs::path curves_svg = svg.parent_path() / (svg.stem().string() + "_curves.svg");
  write_loss_curves_comparison(labels, curves, curves_svg.string());
  std::printf("wrote %s (training and validation loss)\n", curves_svg.c_str());
}

}  // namespace

void register_plot_command(CLI::App& app) {
  struct Args {
    std::string run, out = "compare.svg";
    std::vector<std::string> compare;
  };
  auto a = std::make_shared<Args>();
  CLI::App* cmd = app.add_subcommand(
      "plot", "Plot a run's train/validation loss, or compare runs (loss by position) (SVG)");
  cmd->add_option("run", a->run, "run folder (holds metrics.jsonl): writes <run>/loss.svg");
  CLI::Option* compare = cmd->add_option(
      "--compare", a->compare,
      "runs to compare, one curve each: run folders holding loss_by_position.json (nsa eval "
      "--by-position) or such files; also their training curves when every run has metrics");
  CLI::Option* out =
      cmd->add_option("--out", a->out,
                      "--compare: the loss-by-position SVG (default compare.svg); the curves go to "
                      "<name>_curves.svg beside it");
  cmd->callback([a, compare, out] {
    const bool comparing = compare->count() > 0;
    NSA_CHECK(!comparing || a->run.empty(),
              "nsa plot: pass one run folder, or --compare RUN...; "
              "not both ('",
              a->run, "' and --compare)");
    NSA_CHECK(comparing || out->count() == 0, "nsa plot: --out belongs to --compare");
    if (comparing) {
      plot_compare(a->compare, a->out);
      return;
    }
    NSA_CHECK(!a->run.empty(),
              "nsa plot: name a run folder (nsa plot runs/x), or compare runs "
              "(nsa plot --compare runs/a runs/b)");
    const std::string svg = a->run + "/loss.svg";
    write_loss_plot(a->run + "/metrics.jsonl", svg);
    std::printf("wrote %s\n", svg.c_str());
  });
}

}  // namespace nsa::app
