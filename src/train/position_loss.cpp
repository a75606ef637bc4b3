// Validation loss by token position (see position_loss.h).
#include "position_loss.h"

#include <cmath>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "io/durable_file.h"
#include "nsa/error.h"
#include "svg_plot.h"
#include "token_loader.h"
#include "trainer.h"

namespace nsa {

constexpr const char* kPositionLossFormat = "nsa-loss-by-position";
constexpr int kPositionLossVersion = 1;

std::vector<double> token_losses_cpu(const ModelConfig& cfg, const ModelParams<float>& params,
                                     const SeqLayout& layout, const std::vector<int32_t>& inputs,
                                     const std::vector<int32_t>& targets) {
  ModelStats stats;
  stats.keep_token_losses = true;
  model_loss_cpu<float>(cfg, params, layout, inputs, targets, nullptr, &stats);
  return std::move(stats.token_loss);
}

std::vector<int64_t> position_bucket_edges(int64_t S, const std::vector<int64_t>& edges,
                                           const std::string& flag) {
  NSA_CHECK(S > 0, "the sequence length ", S, " must be positive");
  std::vector<int64_t> out{0};
  if (edges.empty()) {
    for (int64_t e = 512; e < S; e *= 2) out.push_back(e);
    out.push_back(S);
    return out;
  }
  for (size_t i = 0; i < edges.size(); ++i) {
    const int64_t e = edges[i];
    NSA_CHECK(e >= 0 && e <= S, flag, ": edge ", e, " is outside [0, ", S,
              "] (the sequence length S = ", S, ")");
    NSA_CHECK(i == 0 || e > edges[i - 1], flag, ": the edges must be strictly increasing (",
              edges[i - 1], " then ", e, ")");
    if (e > 0 && e < S) out.push_back(e);
  }
  out.push_back(S);
  return out;
}

PositionLoss evaluate_loss_by_position(const std::string& checkpoint, const std::string& data,
                                       int64_t batches, int64_t batch, int64_t seq_len,
                                       const std::vector<int64_t>& edges,
                                       const TokenLossesFn& token_losses,
                                       const std::string& device) {
  const LoadedModel m = load_model_checkpoint(checkpoint);
  const int64_t S = seq_len > 0 ? seq_len : m.cfg.seq_len;
  const std::vector<int64_t> e = position_bucket_edges(S, edges, "--buckets");
  PositionLoss r;
  r.checkpoint = checkpoint, r.data = data, r.device = device, r.attention = m.cfg.attention;
  r.step = m.step, r.seq_len = S, r.w = m.cfg.attn.w, r.batches = batches, r.batch = batch;
  r.tokens = batches * batch * S;
  std::vector<double> sum(e.size() - 1, 0.0);
  std::vector<int> bucket_of(static_cast<size_t>(S));
  for (size_t i = 0; i + 1 < e.size(); ++i) {
    for (int64_t p = e[i]; p < e[i + 1]; ++p) bucket_of[p] = static_cast<int>(i);
  }
  TokenLoader val(data, "val", m.cfg.vocab_size, m.cfg.seed);
  const SeqLayout layout = SeqLayout::batch(batch, S);
  double total = 0;
  for (int64_t b = 0; b < batches; ++b) {
    const Batch x = val.next(batch, S);
    const std::vector<double> loss = token_losses(m.cfg, m.params, layout, x.inputs, x.targets);
    NSA_CHECK(static_cast<int64_t>(loss.size()) == batch * S, "loss by position: ", loss.size(),
              " token losses for a batch of ", batch * S, " tokens");
    // The batch mean as the model's cross-entropy sums it (row order), then the mean of the
    // batch means as in validation_loss: the same number nsa eval prints.
    double batch_sum = 0;
    for (int64_t t = 0; t < batch * S; ++t) {
      NSA_CHECK(std::isfinite(loss[t]), "loss by position: the loss of token ", t % S,
                " of sequence ", t / S, " of validation batch ", b, " is ", loss[t]);
      batch_sum += loss[t];
      sum[bucket_of[t % S]] += loss[t];
    }
    total += batch_sum / static_cast<double>(batch * S);
  }
  r.loss = total / static_cast<double>(batches);
  for (size_t i = 0; i + 1 < e.size(); ++i) {
    PositionBucket k;
    k.begin = e[i], k.end = e[i + 1], k.tokens = (e[i + 1] - e[i]) * batches * batch;
    k.loss = sum[i] / static_cast<double>(k.tokens);
    r.buckets.push_back(k);
  }
  return r;
}

void write_position_loss_json(const PositionLoss& r, const std::string& path) {
  nlohmann::ordered_json j;
  j["format"] = kPositionLossFormat;
  j["version"] = kPositionLossVersion;
  j["checkpoint"] = r.checkpoint;
  j["step"] = r.step;
  j["attention"] = r.attention;
  j["w"] = r.w;
  j["seq_len"] = r.seq_len;
  j["data"] = r.data;
  j["batches"] = r.batches;
  j["batch"] = r.batch;
  j["device"] = r.device;
  j["tokens"] = r.tokens;
  j["val_loss"] = r.loss;
  j["buckets"] = nlohmann::ordered_json::array();
  for (const PositionBucket& k : r.buckets) {
    j["buckets"].push_back(
        {{"begin", k.begin}, {"end", k.end}, {"tokens", k.tokens}, {"loss", k.loss}});
  }
  io::write_file_durably(path, j.dump(2) + "\n");
}

PositionLoss read_position_loss_json(const std::string& path) {
  std::ifstream in(path);
  NSA_CHECK(in, "cannot read the loss-by-position file '", path,
            "' (nsa eval --by-position writes it)");
  std::stringstream text;
  text << in.rdbuf();
  const nlohmann::json j = nlohmann::json::parse(text.str(), nullptr, false);
  const std::string where = str("loss-by-position file '", path, "'");
  NSA_CHECK(!j.is_discarded() && j.is_object(), where, " is not a JSON object");
  const auto integer = [&](const char* key) {
    NSA_CHECK(j.contains(key) && j[key].is_number_integer() && j[key].get<int64_t>() >= 0, where,
              ": field '", key, "' must be a non-negative integer");
    return j[key].get<int64_t>();
  };
  const auto text_field = [&](const char* key) {
    NSA_CHECK(j.contains(key) && j[key].is_string(), where, ": field '", key, "' must be a string");
    return j[key].get<std::string>();
  };
  const auto number = [&](const nlohmann::json& o, const char* key, const std::string& at) {
    NSA_CHECK(o.contains(key) && o[key].is_number() && std::isfinite(o[key].get<double>()), where,
              ": field '", at, key, "' must be a finite number");
    return o[key].get<double>();
  };
  NSA_CHECK(text_field("format") == kPositionLossFormat, where, ": field 'format' must be \"",
            kPositionLossFormat, "\"");
  NSA_CHECK(integer("version") == kPositionLossVersion, where, ": field 'version' must be ",
            kPositionLossVersion, " (this build reads version ", kPositionLossVersion, ")");
  PositionLoss r;
  r.checkpoint = text_field("checkpoint"), r.attention = text_field("attention");
  r.data = text_field("data"), r.device = text_field("device");
  r.step = integer("step"), r.w = integer("w"), r.seq_len = integer("seq_len");
  r.batches = integer("batches"), r.batch = integer("batch"), r.tokens = integer("tokens");
  r.loss = number(j, "val_loss", "");
  NSA_CHECK(j.contains("buckets") && j["buckets"].is_array() && !j["buckets"].empty(), where,
            ": field 'buckets' must be a non-empty array");
  int64_t next = 0;
  for (size_t i = 0; i < j["buckets"].size(); ++i) {
    const nlohmann::json b = j["buckets"][i];  // a copy: GCC 13 -Wdangling-reference
    const std::string at = str("buckets[", i, "].");
    NSA_CHECK(b.is_object() && b.contains("begin") && b["begin"].is_number_integer() &&
                  b.contains("end") && b["end"].is_number_integer() && b.contains("tokens") &&
                  b["tokens"].is_number_integer(),
              where, ": ", at, "begin, end and tokens must be integers");
    PositionBucket k;
    k.begin = b["begin"].get<int64_t>(), k.end = b["end"].get<int64_t>();
    k.tokens = b["tokens"].get<int64_t>(), k.loss = number(b, "loss", at);
    NSA_CHECK(k.begin == next && k.end > k.begin, where, ": ", at, "[", k.begin, ", ", k.end,
              ") must start at ", next, " and be non-empty (the buckets cover 0..seq_len once)");
    next = k.end;
    r.buckets.push_back(k);
  }
  NSA_CHECK(next == r.seq_len, where, ": the buckets end at ", next,
            ", not at seq_len = ", r.seq_len);
  return r;
}

void write_position_loss_plot(const std::vector<std::string>& labels,
                              const std::vector<PositionLoss>& runs, const std::string& svg_path) {
  NSA_CHECK(labels.size() == runs.size(), "loss by position: ", labels.size(), " labels for ",
            runs.size(), " runs");
  Plot plot;
  plot.title = "validation loss by position";
  plot.x_label = "token position (bucket centre, log2 scale)";
  plot.y_label = "loss (nats)";
  plot.log2_x = true;
  std::map<int64_t, std::string> windows;
  for (size_t i = 0; i < runs.size(); ++i) {
    PlotSeries s;
    // "runs/a" with attention full: "a (full)"; a run named after its attention: the name alone.
    s.label =
        labels[i] == runs[i].attention ? labels[i] : labels[i] + " (" + runs[i].attention + ")";
    s.color = static_cast<int>(i);
    s.markers = true;
    for (const PositionBucket& k : runs[i].buckets)
      s.points.emplace_back(0.5 * static_cast<double>(k.begin + k.end), k.loss);
    plot.series.push_back(std::move(s));
    if (runs[i].attention != "full") windows[runs[i].w] = str("w = ", runs[i].w);
  }
  for (const auto& [w, label] : windows) plot.x_marks.push_back({static_cast<double>(w), label});
  write_svg_plot(plot, svg_path);
}

}  // namespace nsa
