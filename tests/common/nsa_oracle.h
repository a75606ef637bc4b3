// An independent brute-force NSA for tests: dense masks and full score matrices, double precision,
// one sequence at a time. Written from docs/nsa.md without sharing code with src/cpu, so that the
// reference and the oracle can only agree by both being right. Tiny sizes only (it is O(S²)).
#pragma once

#include <cstdint>
#include <vector>

#include "nsa/attention.h"

namespace nsa::test {

struct OracleResult {
  Tensor<double> o;                       // [T, H, dv]
  Tensor<double> o_branch[kNumBranches];  // [T, H, dv]
  std::vector<std::vector<int32_t>> sel;  // [T * G], each an ascending set of blocks
};

OracleResult nsa_oracle(const NsaConfig& cfg, const SeqLayout& layout,
                        const NsaTensors<double>& in);

// Plain causal softmax attention (GQA: head h reads group h / (H/G)) over each sequence.
Tensor<double> causal_attention(const NsaConfig& cfg, const SeqLayout& layout,
                                const Tensor<double>& q, const Tensor<double>& k,
                                const Tensor<double>& v);

}  // namespace nsa::test
