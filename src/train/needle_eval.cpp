// Needle retrieval accuracy (see needle_eval.h).
#include "needle_eval.h"

#include <algorithm>

#include "data/needle.h"
#include "model/model_cpu.h"
#include "nsa/error.h"
#include "trainer.h"

namespace nsa {

std::vector<float> logit_rows_cpu(const ModelConfig& cfg, const ModelParams<float>& params,
                                  const SeqLayout& layout, const std::vector<int32_t>& inputs,
                                  const std::vector<int32_t>& targets,
                                  const std::vector<int64_t>& rows, ProbeRows* probe) {
  ModelStats stats;
  stats.keep_outputs = true;
  if (probe) stats.mass_queries = probe->mass_queries;
  model_loss_cpu<float>(cfg, params, layout, inputs, targets, nullptr, &stats);
  const int64_t V = cfg.vocab_size;
  std::vector<float> out(rows.size() * static_cast<size_t>(V));
  for (size_t i = 0; i < rows.size(); ++i)
    std::copy_n(stats.logits.ptr() + rows[i] * V, V, out.begin() + static_cast<int64_t>(i) * V);
  if (probe) *probe = gather_probe_rows(stats, rows);
  return out;
}

namespace {

// The position of the needle's first value token (its value tokens: first .. first + 3).
int64_t first_value_token(const NeedleSequence& seq) {
  return seq.needle_at + 1 + kNeedleKeyLen;
}

// The attention-mass queries of sample i of a chunk (sequences of T tokens, needle_eval.h), from
// the row that predicts the first value token, in NeedleSpan order: the value tokens, and their
// selection blocks up to that row.
void add_needle_mass_queries(const NeedleSequence& seq, int64_t i, int64_t T, int64_t l_sel,
                             std::vector<MassQuery>& out) {
  const int64_t first = first_value_token(seq), end = first + kNeedleValueLen;
  const int64_t row = seq.value_at - 1;
  out.push_back(MassQuery{i * T + row, i * T + first, i * T + end});
  const int64_t b0 = first / l_sel, b1 = (end - 1) / l_sel;
  out.push_back(
      MassQuery{i * T + row, i * T + b0 * l_sel, i * T + std::min((b1 + 1) * l_sel, row + 1)});
}

// The probe of sample `seq`, the chunk's sample `sample` (needle_eval.h): its selections and
// gates at row `row` of probe (the row that predicts the first value token, value_at − 1 of the
// sequence), and where the model answered them, its attention mass on the value tokens and on
// their blocks there.
void probe_sample(const NsaConfig& a, const NeedleSequence& seq, const ProbeRows& probe,
                  int64_t row, int64_t sample, bool retrieved, NeedleCell& cell) {
  const std::vector<std::vector<int32_t>>& sel = probe.sel;
  NSA_CHECK(sel.size() == cell.selected_any.size(), "needle probe: ", sel.size(),
            " layers' selections for a model of ", cell.selected_any.size(), " layers");
  const int64_t at = seq.value_at - 1;  // the probed position
  const int64_t first = first_value_token(seq), last = first + kNeedleValueLen - 1;
  const int64_t b0 = first / a.l_sel, b1 = last / a.l_sel;  // the value tokens' blocks
  cell.in_window += first > at - a.w ? 1 : 0;
  const int64_t per_row = a.groups * a.n_sel;
  bool anywhere = false;
  for (size_t l = 0; l < sel.size(); ++l) {
    NSA_CHECK(static_cast<int64_t>(sel[l].size()) >= (row + 1) * per_row, "needle probe: layer ", l,
              "'s selection is too short");
    int64_t groups_with = 0;
    for (int64_t g = 0; g < a.groups; ++g) {
      const int32_t* s = sel[l].data() + row * per_row + g * a.n_sel;
      bool has = false;
      for (int64_t k = 0; k < a.n_sel; ++k) has = has || (s[k] >= b0 && s[k] <= b1);
      groups_with += has ? 1 : 0;
    }
    cell.selected_any[l] += groups_with > 0 ? 1 : 0;
    cell.selected_all[l] += groups_with == a.groups ? 1 : 0;
    anywhere = anywhere || groups_with > 0;
  }
  cell.missed_unselected += !retrieved && !anywhere ? 1 : 0;
  NSA_CHECK(probe.gates.size() == sel.size(), "needle probe: ", probe.gates.size(),
            " layers' gates for ", sel.size(), " layers' selections");
  const int64_t per_gate_row = a.heads * kNumBranches;
  for (size_t l = 0; l < probe.gates.size(); ++l) {
    NSA_CHECK(static_cast<int64_t>(probe.gates[l].size()) >= (row + 1) * per_gate_row,
              "needle probe: layer ", l, "'s gates are too short");
    for (int64_t i = 0; i < per_gate_row; ++i) {  // head i / 3, branch i % 3
      const double g = probe.gates[l][row * per_gate_row + i];
      cell.gate_sum[l * per_gate_row + i] += g;
      if (!retrieved) cell.gate_sum_missed[l * per_gate_row + i] += g;
    }
  }
  if (probe.mass.empty()) return;  // a GPU model: no attention mass
  NSA_CHECK(probe.mass.size() == sel.size(), "needle probe: ", probe.mass.size(),
            " layers' attention mass for ", sel.size(), " layers");
  const size_t per_span = sel.size() * static_cast<size_t>(a.heads);  // layers · heads
  if (cell.mass_sum.empty()) {
    cell.mass_sum.assign(kNeedleSpans * per_span * kNumBranches, 0.0);
    cell.weight_sum.assign(kNeedleSpans * per_span, 0.0);
    cell.weight_sum_missed.assign(cell.weight_sum.size(), 0.0);
  }
  for (size_t l = 0; l < probe.mass.size(); ++l) {
    NSA_CHECK(
        static_cast<int64_t>(probe.mass[l].size()) >= (sample + 1) * kNeedleSpans * per_gate_row,
        "needle probe: layer ", l, "'s attention mass is too short");
    for (int span = 0; span < kNeedleSpans; ++span) {
      for (int64_t h = 0; h < a.heads; ++h) {
        const float* m =
            probe.mass[l].data() + (sample * kNeedleSpans + span) * per_gate_row + h * kNumBranches;
        const float* g = probe.gates[l].data() + row * per_gate_row + h * kNumBranches;
        const size_t slh = cell.span_layer_head(span, l, h);
        double weight = 0;
        for (int c = 0; c < kNumBranches; ++c) {
          cell.mass_sum[slh * kNumBranches + c] += m[c];
          weight += static_cast<double>(g[c]) * m[c];
        }
        cell.weight_sum[slh] += weight;
        if (!retrieved) cell.weight_sum_missed[slh] += weight;
      }
    }
  }
}

// sum[i] over n samples; 0 without samples or without the sum (a probe not run, a GPU model).
double mean_of(const std::vector<double>& sum, size_t i, int64_t n) {
  return n > 0 && i < sum.size() ? sum[i] / static_cast<double>(n) : 0.0;
}

}  // namespace

double NeedleCell::head_gate(size_t layer, int64_t head, int branch, bool missed) const {
  const size_t lh = layer * static_cast<size_t>(heads()) + static_cast<size_t>(head);
  return mean_of(missed ? gate_sum_missed : gate_sum,
                 lh * kNumBranches + static_cast<size_t>(branch),
                 missed ? samples - retrieved : samples);
}

size_t NeedleCell::span_layer_head(int span, size_t layer, int64_t head) const {
  return (static_cast<size_t>(span) * selected_any.size() + layer) * static_cast<size_t>(heads()) +
         static_cast<size_t>(head);
}

double NeedleCell::head_mass(size_t layer, int64_t head, int branch, int span) const {
  return mean_of(mass_sum,
                 span_layer_head(span, layer, head) * kNumBranches + static_cast<size_t>(branch),
                 samples);
}

double NeedleCell::needle_weight(size_t layer, int64_t head, bool missed, int span) const {
  return mean_of(missed ? weight_sum_missed : weight_sum, span_layer_head(span, layer, head),
                 missed ? samples - retrieved : samples);
}

double NeedleCell::gate(size_t layer, int branch, bool missed) const {
  double mean = 0;
  const int64_t n = heads();
  for (int64_t h = 0; h < n; ++h) mean += head_gate(layer, h, branch, missed);
  return n > 0 ? mean / static_cast<double>(n) : 0.0;
}

std::vector<NeedleCell> evaluate_needle(const std::string& checkpoint, const NeedleEvalOptions& opt,
                                        const LogitRowsFn& logit_rows) {
  const std::vector<int64_t>& seq_lens = opt.seq_lens;
  const std::vector<double>& depths = opt.depths;
  const int64_t samples = opt.samples, n_sel = opt.n_sel;
  const NeedleFiller filler = opt.filler;
  const bool probe = opt.probe;
  // Every argument before any cell is computed (a cell takes minutes on the CPU at 16k).
  NSA_CHECK(samples > 0, "--samples must be positive");
  NSA_CHECK(!seq_lens.empty() && !depths.empty(), "--seq-lens and --depths must not be empty");
  for (const double depth : depths)
    NSA_CHECK(depth >= 0 && depth <= 1, "--depths: ", depth, " is outside [0, 1]");
  for (const int64_t S : seq_lens) {
    NSA_CHECK(S >= kNeedleMinLength && S <= 2147483647, "--seq-lens: ", S,
              " is outside the needle task's [", kNeedleMinLength, ", 2147483647] tokens");
  }
  NSA_CHECK(n_sel == 0 || (n_sel >= 3 && n_sel <= 2147483647), "--n-sel = ", n_sel,
            " must be at least 3 (blocks 0, c − 1 and c are always selected), or 0 for the "
            "checkpoint's own");
  LoadedModel m = load_model_checkpoint(checkpoint);
  if (n_sel > 0) {
    NSA_CHECK(m.cfg.branch_enabled(kSel), "--n-sel: ", checkpoint,
              " has no selected branch (its attention selects no blocks)");
    m.cfg.attn.n_sel = n_sel;
  }
  NSA_CHECK(!probe || m.cfg.branch_enabled(kSel), "--probe: ", checkpoint,
            " has no selected branch (its attention selects no blocks to probe)");
  const int64_t V = m.cfg.vocab_size;
  std::vector<NeedleCell> cells;
  for (const int64_t S : seq_lens) {
    for (const double depth : depths) {
      const int64_t T = S - 1;  // inputs: tokens [0, S − 1), targets: [1, S)
      const int64_t chunk = std::max<int64_t>(1, (int64_t{1} << 16) / T);
      NeedleCell cell;
      cell.seq_len = S, cell.depth = depth, cell.samples = samples;
      if (probe) {
        const auto gates = static_cast<size_t>(m.cfg.n_layers * m.cfg.attn.heads * kNumBranches);
        cell.selected_any.assign(static_cast<size_t>(m.cfg.n_layers), 0);
        cell.selected_all.assign(static_cast<size_t>(m.cfg.n_layers), 0);
        cell.gate_sum.assign(gates, 0.0);
        cell.gate_sum_missed.assign(gates, 0.0);
      }
      for (int64_t first = 0; first < samples; first += chunk) {
        const int64_t n = std::min(chunk, samples - first);
        std::vector<int32_t> inputs, targets;
        std::vector<NeedleSequence> seqs;
        std::vector<int64_t> rows;
        for (int64_t i = 0; i < n; ++i) {
          const uint64_t seed = 0x5eed0000ull + static_cast<uint64_t>(first + i);
          seqs.push_back(make_needle_sequence(S, depth, V, seed, filler));
          const std::vector<int32_t>& t = seqs.back().tokens;
          inputs.insert(inputs.end(), t.begin(), t.end() - 1);
          targets.insert(targets.end(), t.begin() + 1, t.end());
          for (int64_t j = 0; j < kNeedleValueLen; ++j)  // row value_at − 1 + j predicts value j
            rows.push_back(i * T + seqs.back().value_at - 1 + j);
        }
        ProbeRows probed;
        if (probe) {
          for (int64_t i = 0; i < n; ++i)
            add_needle_mass_queries(seqs[i], i, T, m.cfg.attn.l_sel, probed.mass_queries);
        }
        const std::vector<float> logits =
            logit_rows(m.cfg, m.params, SeqLayout::batch(n, T), inputs, targets, rows,
                       probe ? &probed : nullptr);
        for (int64_t i = 0; i < n; ++i) {
          bool all = true;
          for (int64_t j = 0; j < kNeedleValueLen; ++j) {
            const float* row = logits.data() + (i * kNeedleValueLen + j) * V;
            const int64_t best = std::max_element(row, row + V) - row;
            const bool right = best == seqs[i].tokens[seqs[i].value_at + j];
            cell.value_tokens_right += right ? 1 : 0;
            all = all && right;
          }
          cell.retrieved += all ? 1 : 0;
          if (probe) probe_sample(m.cfg.attn, seqs[i], probed, i * kNeedleValueLen, i, all, cell);
        }
      }
      cells.push_back(cell);
    }
  }
  return cells;
}

}  // namespace nsa
