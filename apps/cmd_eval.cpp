// `nsa eval`: validation loss and perplexity of a checkpoint (its own config and weights), the
// same loss by token-position bucket (--by-position: JSON and SVG, train/position_loss.h), or its
// needle-retrieval accuracy by context length and depth (--task needle).
#include <cstdio>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "backends.h"
#include "commands.h"
#include "data/needle.h"
#include "nsa/error.h"
#include "nsa/size_limits.h"
#include "train/checkpoint.h"
#include "train/needle_eval.h"
#include "train/position_loss.h"
#include "train/trainer.h"

namespace nsa::app {

namespace {

// --batches, --batch and --seq-len in range, and a batch's logits within this machine's memory.
void check_eval_sizes(int64_t batches, int64_t batch, int64_t seq_len) {
  NSA_CHECK(batches >= 1 && batches <= (1 << 30), "--batches = ", batches,
            " must be in [1, 1073741824]");
  NSA_CHECK(batch >= 1 && batch <= (1 << 30), "--batch = ", batch, " must be in [1, 1073741824]");
  NSA_CHECK(seq_len >= 0 && seq_len <= 2147483647, "--seq-len = ", seq_len,
            " must be in [0, 2147483647] (0: the checkpoint config's seq_len)");
  const std::string what = "a batch (--batch × --seq-len tokens)";
  check_memory(checked_product({batch, seq_len, 8}, what), what);
}

// --by-position: the buckets' table, the JSON file and its SVG plot.
void eval_by_position(const std::string& ckpt, const std::string& data, int64_t batches,
                      int64_t batch, int64_t seq_len, const std::vector<int64_t>& buckets,
                      const std::string& out, const std::string& device) {
  namespace fs = std::filesystem;
  fs::path ckpt_dir(ckpt);
  if (!ckpt_dir.has_filename()) ckpt_dir = ckpt_dir.parent_path();  // "ckpt_…/"
  const fs::path run_dir = ckpt_dir.parent_path();
  const fs::path json = out.empty() ? run_dir / "loss_by_position.json" : fs::path(out);
  NSA_CHECK(json.extension() == ".json", "--out '", out,
            "' must name a .json file (the SVG plot is written next to it)");
  const fs::path svg = fs::path(json).replace_extension(".svg");
  const Backend b = backend(device, "nsa eval --by-position");
  const PositionLoss r = evaluate_loss_by_position(ckpt, data, batches, batch, seq_len, buckets,
                                                   b.token_losses(), device);
  std::printf(
      "%s (step %lld, attention %s, w = %lld): val loss %.4f over %lld tokens, by position\n",
      ckpt.c_str(), static_cast<long long>(r.step), r.attention.c_str(),
      static_cast<long long>(r.w), r.loss, static_cast<long long>(r.tokens));
  std::printf("%10s %10s %12s %10s\n", "begin", "end", "tokens", "loss");
  for (const PositionBucket& k : r.buckets) {
    std::printf("%10lld %10lld %12lld %10.4f\n", static_cast<long long>(k.begin),
                static_cast<long long>(k.end), static_cast<long long>(k.tokens), k.loss);
  }
  if (json.has_parent_path()) fs::create_directories(json.parent_path());
  write_position_loss_json(r, json.string());
  const fs::path label = run_dir.has_filename() ? run_dir.filename() : ckpt_dir.filename();
  write_position_loss_plot({label.string()}, {r}, svg.string());
  std::printf("wrote %s and %s\n", json.c_str(), svg.c_str());
}

// A table with a row per cell and, per layer, one number per head: value(cell, layer, head).
template <typename Value>
void print_per_head(const std::vector<NeedleCell>& cells, size_t layers, const char* title,
                    const Value& value) {
  std::printf("%s\n", title);
  for (const NeedleCell& c : cells) {
    std::printf("%8lld %6.2f", static_cast<long long>(c.seq_len), c.depth);
    for (size_t l = 0; l < layers; ++l) {
      std::printf("  ");
      for (int64_t h = 0; h < c.heads(); ++h) std::printf(" %4.2f", value(c, l, h));
    }
    std::printf("\n");
  }
}

// --probe: per cell, the fraction of samples whose needle each layer selected (any group / every
// group), in the window, and the misses whose needle no layer selected.
void print_needle_probe(const std::vector<NeedleCell>& cells) {
  std::printf(
      "probe at the query's last key token: samples whose needle (its value tokens' blocks) the "
      "layer selected, by any group / every group\n%8s %6s",
      "S", "depth");
  const size_t layers = cells.empty() ? 0 : cells[0].selected_any.size();
  for (size_t l = 0; l < layers; ++l) std::printf("   layer %-3zu", l);
  std::printf(" %9s %10s %19s\n", "in window", "retrieved", "misses unselected");
  for (const NeedleCell& c : cells) {
    const double n = static_cast<double>(c.samples);
    std::printf("%8lld %6.2f", static_cast<long long>(c.seq_len), c.depth);
    for (size_t l = 0; l < layers; ++l)
      std::printf("   %4.2f/%4.2f", c.selected_any[l] / n, c.selected_all[l] / n);
    std::printf(" %9.2f %10.2f %8lld of %-7lld\n", c.in_window / n, c.accuracy(),
                static_cast<long long>(c.missed_unselected),
                static_cast<long long>(c.samples - c.retrieved));
  }
  std::printf("gates there (mean over the heads and samples): cmp / sel / win per layer\n%8s %6s",
              "S", "depth");
  for (size_t l = 0; l < layers; ++l) std::printf("   layer %-9zu", l);
  std::printf("\n");
  for (const NeedleCell& c : cells) {
    std::printf("%8lld %6.2f", static_cast<long long>(c.seq_len), c.depth);
    for (size_t l = 0; l < layers; ++l)
      std::printf("   %4.2f/%4.2f/%4.2f", c.gate(l, 0), c.gate(l, 1), c.gate(l, 2));
    std::printf("\n");
  }
  // A head mean can hide one head that uses its selection fully: the selected branch's gate of
  // each head.
  print_per_head(
      cells, layers,
      "the selected branch's gate per head there (mean over the samples), layer by layer",
      [](const NeedleCell& c, size_t l, int64_t h) { return c.head_gate(l, h, 1); });
  if (cells.empty() || cells[0].weight_sum.empty()) return;  // a GPU model: no attention mass
  print_per_head(cells, layers,
                 "the needle's value tokens' weight in each head's output there, the sum over the "
                 "branches of gate · attention mass (mean over the samples), layer by layer",
                 [](const NeedleCell& c, size_t l, int64_t h) {
                   return c.needle_weight(l, h, false, kValueTokens);
                 });
  print_per_head(cells, layers,
                 "the needle's blocks' (those of its value tokens) weight in each head's output "
                 "there, the sum over the branches of gate · attention mass (mean over the "
                 "samples), layer by layer",
                 [](const NeedleCell& c, size_t l, int64_t h) {
                   return c.needle_weight(l, h, false, kValueBlocks);
                 });
}

std::string needle_probe_json(const NeedleCell& c) {
  const auto list = [](const std::vector<int64_t>& v) {
    std::string s = "[";
    for (size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + std::to_string(v[i]);
    return s + "]";
  };
  const size_t layers = c.selected_any.size();
  const auto triple = [](double a, double b, double d) {
    char buf[64];
    std::snprintf(buf, sizeof(buf), "[%.4f,%.4f,%.4f]", a, b, d);
    return std::string(buf);
  };
  // Mean gates per layer, [[cmp, sel, win], …] over the heads (head_gates: per layer, per head),
  // over all samples and over the missed ones (null without misses).
  const auto gates = [&](bool missed) {
    if (missed && c.samples == c.retrieved) return std::string("null");
    std::string s = "[";
    for (size_t l = 0; l < layers; ++l)
      s +=
          (l ? "," : "") + triple(c.gate(l, 0, missed), c.gate(l, 1, missed), c.gate(l, 2, missed));
    return s + "]";
  };
  // Per layer, per head: value(layer, head), a JSON text.
  const auto per_head = [&](const auto& value) {
    std::string s = "[";
    for (size_t l = 0; l < layers; ++l) {
      s += l ? ",[" : "[";
      for (int64_t h = 0; h < c.heads(); ++h) s += (h ? "," : "") + value(l, h);
      s += "]";
    }
    return s + "]";
  };
  const auto head_gates = [&](bool missed) {
    if (missed && c.samples == c.retrieved) return std::string("null");
    return per_head([&](size_t l, int64_t h) {
      return triple(c.head_gate(l, h, 0, missed), c.head_gate(l, h, 1, missed),
                    c.head_gate(l, h, 2, missed));
    });
  };
  const auto number = [](double x) {
    char buf[32];
    std::snprintf(buf, sizeof(buf), "%.4f", x);
    return std::string(buf);
  };
  // The CPU model's attention mass on the needle's value tokens (needle_…) and on their blocks
  // (needle_block_…): per layer, per head [cmp, sel, win]; the weight per layer and head over all
  // samples and over the missed ones.
  std::string mass;
  for (int span = 0; span < kNeedleSpans && !c.weight_sum.empty(); ++span) {
    const std::string name = span == kValueTokens ? "needle_" : "needle_block_";
    mass += ",\"" + name + "mass\":" + per_head([&](size_t l, int64_t h) {
              return triple(c.head_mass(l, h, 0, span), c.head_mass(l, h, 1, span),
                            c.head_mass(l, h, 2, span));
            });
    mass += ",\"" + name + "weight\":" + per_head([&](size_t l, int64_t h) {
              return number(c.needle_weight(l, h, false, span));
            });
    mass += ",\"" + name + "weight_missed\":" +
            (c.samples == c.retrieved ? std::string("null") : per_head([&](size_t l, int64_t h) {
              return number(c.needle_weight(l, h, true, span));
            }));
  }
  return ",\"selected_any\":" + list(c.selected_any) + ",\"selected_all\":" + list(c.selected_all) +
         ",\"in_window\":" + std::to_string(c.in_window) +
         ",\"missed_unselected\":" + std::to_string(c.missed_unselected) +
         ",\"gates\":" + gates(false) + ",\"gates_missed\":" + gates(true) +
         ",\"head_gates\":" + head_gates(false) + ",\"head_gates_missed\":" + head_gates(true) +
         mass;
}

}  // namespace

void register_eval_command(CLI::App& app) {
  struct Args {
    std::string checkpoint, run, data;
    int64_t batches = 20, batch = 8, seq_len = 0;
    std::string task = "loss", device = "cpu";
    std::vector<int64_t> seq_lens = {1024, 4096, 16384};
    std::vector<double> depths = {0.0, 0.25, 0.5, 0.75, 1.0};
    int64_t samples = 20;
    std::string filler = "cycle";
    bool probe = false;
    int64_t n_sel = 0;
    bool by_position = false;
    std::vector<int64_t> buckets;
    std::string out;
  };
  auto a = std::make_shared<Args>();
  CLI::App* cmd = app.add_subcommand("eval", "Validation loss / perplexity of a checkpoint");
  cmd->add_option("--checkpoint", a->checkpoint, "a ckpt_* folder");
  cmd->add_option("--run", a->run, "a run folder: its newest complete checkpoint");
  cmd->add_option("--task", a->task, "loss (validation loss) or needle (retrieval accuracy)")
      ->check(CLI::IsMember({"loss", "needle"}));
  CLI::Option* data = cmd->add_option("--data", a->data,
                                      "folder with val_*.bin shards (or 'synthetic'); task loss");
  // The needle task's options, and the loss evaluation's: each refused with the other task.
  const std::vector<CLI::Option*> needle_only = {
      cmd->add_option("--seq-lens", a->seq_lens, "needle: context lengths")->delimiter(','),
      cmd->add_option("--depths", a->depths, "needle: depths in [0, 1]")->delimiter(','),
      cmd->add_option("--samples", a->samples, "needle: sequences per (length, depth)"),
      cmd->add_option("--filler", a->filler,
                      "needle: the haystack, cycle (16 tokens repeating) or random symbols"),
      cmd->add_flag("--probe", a->probe,
                    "needle: also whether each layer selected the needle where the answer starts "
                    "(docs/quality.md)"),
      cmd->add_option("--n-sel", a->n_sel,
                      "needle: attend with this many selected blocks instead of the checkpoint's "
                      "n_sel (no weight depends on it; docs/quality.md)")};
  CLI::Option* device =
      cmd->add_option("--device", a->device,
                      "needle and --by-position: cpu (the reference) or cuda (one GPU)")
          ->check(CLI::IsMember({"cpu", "cuda"}));
  CLI::Option* by_position = cmd->add_flag(
      "--by-position", a->by_position,
      "mean validation loss per token-position bucket: JSON and SVG (docs/quality.md)");
  CLI::Option* buckets =
      cmd->add_option("--buckets", a->buckets,
                      "--by-position: bucket edges, e.g. 0,256,1024 (0 and S are added; default "
                      "0,512,1024,2048,... up to S)")
          ->delimiter(',');
  CLI::Option* out = cmd->add_option(
      "--out", a->out,
      "--by-position: the JSON file (default: <run>/loss_by_position.json); the SVG goes next "
      "to it");
  const std::vector<CLI::Option*> loss_only = {
      data, cmd->add_option("--batches", a->batches, "validation batches"),
      cmd->add_option("--batch", a->batch, "sequences per batch"),
      cmd->add_option("--seq-len", a->seq_len, "tokens per sequence (default: the config's)")};
  cmd->callback([a, by_position, buckets, out, device, needle_only, loss_only] {
    const auto first_given = [](const std::vector<CLI::Option*>& options) -> std::string {
      for (const CLI::Option* o : options) {
        if (o->count() > 0) return o->get_name();
      }
      return "";
    };
    if (a->task == "needle") {
      const std::string f = first_given(loss_only);
      NSA_CHECK(f.empty(), "nsa eval --task needle: ", f,
                " belongs to the loss evaluation (--task loss); the needle task takes --seq-lens, "
                "--depths, --samples, --filler, --probe and --n-sel");
    } else {
      const std::string f = first_given(needle_only);
      NSA_CHECK(f.empty(), "nsa eval: ", f, " belongs to --task needle");
      NSA_CHECK(a->by_position || device->count() == 0,
                "nsa eval: --device applies to --task needle and --by-position; the plain loss "
                "evaluation runs on the CPU");
    }
    NSA_CHECK(by_position->count() > 0 || (buckets->count() == 0 && out->count() == 0),
              "nsa eval: --buckets and --out belong to --by-position");
    NSA_CHECK(!a->by_position || a->task == "loss",
              "nsa eval: --by-position is a loss evaluation; it cannot be combined with --task ",
              a->task);
    const std::string ckpt = resolve_checkpoint(a->checkpoint, a->run);
    if (a->task == "needle") {
      const LogitRowsFn logit_rows = backend(a->device, "nsa eval").logit_rows();
      const NeedleFiller filler = parse_needle_filler(a->filler, "--filler");
      const std::vector<NeedleCell> cells = evaluate_needle(
          ckpt, {a->seq_lens, a->depths, a->samples, filler, a->probe, a->n_sel}, logit_rows);
      std::printf("needle retrieval of %s (%s filler, %lld samples per cell%s; accuracy)\n%8s",
                  ckpt.c_str(), needle_filler_name(filler), static_cast<long long>(a->samples),
                  a->n_sel > 0 ? (", n_sel " + std::to_string(a->n_sel)).c_str() : "",
                  "S \\ depth");
      for (double d : a->depths) std::printf(" %7.2f", d);
      for (size_t i = 0; i < cells.size(); ++i) {
        if (i % a->depths.size() == 0)
          std::printf("\n%8lld", static_cast<long long>(cells[i].seq_len));
        std::printf(" %7.2f", cells[i].accuracy());
      }
      std::printf("\n");
      if (a->probe) print_needle_probe(cells);
      for (const NeedleCell& c : cells) {
        std::printf(
            "{\"task\":\"needle\",\"filler\":\"%s\",\"seq_len\":%lld,\"depth\":%.4f,"
            "\"samples\":%lld,\"retrieved\":%lld,\"accuracy\":%.4f,\"value_token_accuracy\":%.4f%s}"
            "\n",
            needle_filler_name(filler), static_cast<long long>(c.seq_len), c.depth,
            static_cast<long long>(c.samples), static_cast<long long>(c.retrieved), c.accuracy(),
            static_cast<double>(c.value_tokens_right) /
                static_cast<double>(c.samples * kNeedleValueLen),
            a->probe ? needle_probe_json(c).c_str() : "");
      }
      return;
    }
    NSA_CHECK(!a->data.empty(), "nsa eval: --data is required for --task loss");
    check_eval_sizes(a->batches, a->batch, a->seq_len);
    if (a->by_position) {
      eval_by_position(ckpt, a->data, a->batches, a->batch, a->seq_len, a->buckets, a->out,
                       a->device);
      return;
    }
    const EvalResult r = evaluate_checkpoint(ckpt, a->data, a->batches, a->batch, a->seq_len);
    std::printf("%s (step %lld): val loss %.4f, perplexity %.3f over %lld tokens\n", ckpt.c_str(),
                static_cast<long long>(r.step), r.loss, r.ppl, static_cast<long long>(r.tokens));
    if (r.batches < a->batches)
      std::printf(
          "  (the validation split holds %lld distinct batch(es) of this size: --batches "
          "%lld capped to it)\n",
          static_cast<long long>(r.batches), static_cast<long long>(a->batches));
    // The JSON line through the JSON library: a path is escaped, a non-finite loss is null.
    const nlohmann::json line = {
        {"checkpoint", ckpt}, {"step", r.step}, {"val_loss", r.loss}, {"val_ppl", r.ppl}};
    std::printf("%s\n", line.dump().c_str());
  });
}

}  // namespace nsa::app
