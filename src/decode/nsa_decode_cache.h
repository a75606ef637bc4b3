// NSA attention for one new token at a time, with caches (docs/inference.md), on the CPU.
//
// Caches per layer: raw K/V of the selected branch (every position), a ring of the last w raw K/V
// for the window, a ring of the last l raw K/V of the compressed branch, and the compressed K/V,
// one token emitted every d steps once l are available (exactly when it becomes visible). Each
// step runs the same per-query computation as nsa_forward_cpu over the same key rows in the same
// order – the window ring is read oldest first – so decoding reproduces a full forward bit for
// bit, selected blocks included (tested).
#pragma once

#include <cstdint>
#include <vector>

#include "nsa/attention.h"

namespace nsa {

class NsaDecodeCache {
 public:
  explicit NsaDecodeCache(const NsaConfig& cfg);

  // One token at position len(): q [H·dk], k/v per branch [G·dk] / [G·dv] (kv = shared: index 0),
  // gates per branch [H]. Writes o [H·dv] and sel [G·n_sel]; φ = mlp needs phi_k / phi_v.
  void step(const float* q, const float* const k[kNumBranches], const float* const v[kNumBranches],
            const float* const gate[kNumBranches], const PhiMlpParams<float>* phi_k,
            const PhiMlpParams<float>* phi_v, float* o, int32_t* sel);

  // Fills an empty cache with S tokens at once from their raw (rotated) K/V per branch
  // ([S, G, dk] / [S, G, dv]; kv = shared: index 0): the state S calls of step() would leave,
  // without computing attention outputs (batched prefill).
  void prefill(const Tensor<float> (&k)[kNumBranches], const Tensor<float> (&v)[kNumBranches],
               const PhiMlpParams<float>* phi_k, const PhiMlpParams<float>* phi_v);

  int64_t length() const { return len_; }
  int64_t num_compressed() const { return n_cmp_; }
  // Bytes of K/V the last step read (compressed + selected + window), the paper's access model.
  int64_t last_step_kv_bytes() const { return last_bytes_; }

 private:
  NsaConfig cfg_;
  int64_t len_ = 0, n_cmp_ = 0, last_bytes_ = 0;
  std::vector<float> k_sel_, v_sel_;  // [len, G, d]
  std::vector<float> k_win_, v_win_;  // ring [w, G, d]
  std::vector<float> k_raw_, v_raw_;  // ring [l, G, d] of the compressed branch
  std::vector<float> k_cmp_, v_cmp_;  // [n_cmp, G, d]
};

}  // namespace nsa
