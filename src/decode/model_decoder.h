// Incremental decoding of the NSA language model on the CPU: one token in, next-token logits out,
// with per-layer NSA caches (see nsa_decode_cache.h). Decoding S tokens one by one gives exactly
// the logits and selected blocks of one full forward over the same tokens (tested); prefill runs
// that forward over a whole prompt once and fills the caches from it, leaving the same state bit
// for bit (tested).
#pragma once

#include <cstdint>
#include <vector>

#include "model/model_params.h"
#include "nsa_decode_cache.h"

namespace nsa {

class ModelDecoder {
 public:
  // max_len: the most tokens this decoder will see (0: unbounded). attention = full needs it: its
  // window covers every position, so the window cache holds max_len tokens.
  ModelDecoder(const ModelConfig& cfg, const ModelParams<float>& params, int64_t max_len = 0);
  // Feeds `token` at the next position; returns the logits for the position after it [vocab].
  std::vector<float> step(int32_t token);
  // Feeds a whole prompt at once to a fresh decoder: the model's forward over the prompt, every
  // layer's cache filled from its K/V (NsaDecodeCache::prefill). Returns the logits after the
  // prompt's last token [vocab]; last_selection() is that token's. Throws nsa::Error for an empty
  // prompt, a token outside the vocabulary, or a decoder that has already stepped.
  std::vector<float> prefill(const std::vector<int32_t>& prompt);
  int64_t position() const { return pos_; }
  // Selected blocks of the last step, per layer [G·n_sel].
  const std::vector<std::vector<int32_t>>& last_selection() const { return sel_; }
  // K/V bytes the attention read in the last step, summed over layers.
  int64_t last_step_kv_bytes() const;

 private:
  ModelConfig cfg_;
  const ModelParams<float>& p_;
  std::vector<NsaDecodeCache> caches_;
  std::vector<std::vector<int32_t>> sel_;
  int64_t max_len_ = 0, pos_ = 0;
};

}  // namespace nsa
