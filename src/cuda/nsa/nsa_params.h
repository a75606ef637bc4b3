// One flat parameter struct for the NSA CUDA kernels (the flash-attention habit): sizes, the
// sequence layout and every device pointer, with 64-bit sizes. Row-major layouts as on the CPU:
// q [T, H, dk], raw K/V [T, G, dk|dv], compressed K/V [C, G, dk|dv], gates/lse [T, H].
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

namespace nsa::cuda {

using bf16 = __nv_bfloat16;

// The three branches, indexed like kCmp / kSel / kWin of nsa/config.h.
enum class Branch { kCmp = 0, kSel = 1, kWin = 2 };

// A run of consecutive rows of one sequence: query rows, raw key rows or compressed tokens
// (`first` relative to the sequence). Kernels take tables of these as their grid.
struct RowTile {
  int32_t seq;
  int32_t rows;
  int64_t first;
};

struct NsaParams {
  // Shape and hyper-parameters.
  int64_t T, H, G, hpg, dk, dv;
  int64_t l, d, l_sel, n_sel, w;
  float scale;
  // Layout: sequences, their compressed-token and selection-block offsets, and each row's sequence.
  int64_t num_seqs, C, TB;  // C compressed tokens, TB selection blocks, over all sequences
  int64_t max_len;
  const int64_t* cu_seqlens;     // [N + 1]
  const int64_t* cmp_offsets;    // [N + 1]
  const int64_t* blk_offsets;    // [N + 1]
  const int32_t* seq_of_row;     // [T]
  const int64_t* cmp_raw_start;  // [C]: first raw row (global) of each compressed token

  // Inputs (bf16): queries, raw K/V per branch (kv = shared: all three point to one), gates.
  const bf16* q;
  const bf16* k[3];
  const bf16* v[3];
  const bf16* gate[3];
  // Compressed K/V (fp32, produced by the compression op) and their bf16 copies (the attention
  // kernels' operands).
  float* k_cmp;
  float* v_cmp;
  bf16* k_cmp_bf16;
  bf16* v_cmp_bf16;

  // Forward outputs / saved state.
  bf16* o;            // [T, H, dv]
  bf16* o_branch[3];  // [T, H, dv]
  float* lse[3];      // [T, H]
  int32_t* sel_idx;   // [T, G, n_sel]

  // Backward.
  const bf16* d_o;   // [T, H, dv]
  float* delta[3];   // [T, H]: g_c · (dO · o_c)
  float* d_q;        // [T, H, dk]
  float* d_gate[3];  // [T, H]; null where d_gate_bf16 is wanted instead
  // Optional bf16 results for d_q and d_gate (callers that want bf16 gradients, the C ABI):
  // written by the kernel that finishes each (d_q: the selected branch's – the block-major merge,
  // which then leaves the fp32 d_q unfinished, or the query-major dq; d_gate: the preprocessing).
  // Null: not wanted.
  bf16* d_q_bf16;
  bf16* d_gate_bf16[3];
  float* d_k_cmp;  // [C, G, dk] gradient of the compressed keys
  float* d_v_cmp;  // [C, G, dv]
  float* d_k[3];   // raw-key gradients per branch ([T, G, dk]); shared: all three alias one
  float* d_v[3];
  // Optional bf16 copies of d_k / d_v (the C ABI's bf16 gradients), converted as soon as each
  // gradient's last writer has run (nsa_launch.cpp); null: not wanted.
  bf16* d_k_bf16[3];
  bf16* d_v_bf16[3];
  // Inverted selection index (built in the backward): entries sorted by (group, block, row, slot);
  // entry e's low 32 bits are row·n_sel + slot (the query row and which of its n_sel choices the
  // block is); (g, block gb) owns [sel_seg_start[g·TB + gb], sel_seg_end[g·TB + gb]).
  const uint64_t* sel_entries;
  const int64_t* sel_seg_start;
  const int64_t* sel_seg_end;
};

}  // namespace nsa::cuda
