// The kernels of the NSA language model on the GPU besides attention and GEMMs, one .cu per op.
//
// Conventions: the residual stream and every gradient that is accumulated are fp32; GEMM operands
// are bf16 (weights: bf16 copies of the fp32 master weights). Every floating-point reduction has a
// fixed order (no atomics), so a training step is bit-identical from run to run; the only atomics
// are on integers (the selection histogram's counts, the anomaly check's first index), whose
// results do not depend on the order. All launches are asynchronous on `stream`; nothing here
// synchronises with the host.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace nsa::cuda {

using bf16 = __nv_bfloat16;

// embedding.cu: x[t] = table[tokens[t]].
void launch_embedding_forward(const int32_t* tokens, const float* table, float* x, int64_t T,
                              int64_t D, cudaStream_t stream);
// d_table[token] += Σ dx[t] over the rows t holding that token, in ascending t. The rows are
// grouped on the host (EmbeddingIndex in model_cuda.cu): segment s covers order[start[s] ..
// start[s+1]) and belongs to token seg_token[s].
void launch_embedding_backward(const int32_t* order, const int32_t* seg_token,
                               const int32_t* seg_start, int64_t n_seg, const float* dx,
                               float* d_table, int64_t D, cudaStream_t stream);

// rmsnorm.cu: y = x·rstd·w in bf16, rstd = 1/sqrt(mean(x²) + eps) per row.
void launch_rmsnorm_forward(const float* x, const float* w, float eps, bf16* y, float* rstd,
                            int64_t T, int64_t D, cudaStream_t stream);
// dx (+)= rstd·(dy∘w − x̂·mean(dy∘w∘x̂)), and when dx_bf16 is given the bf16 copy of the new dx
// (what the next GEMMs read); dw += Σ_t dy∘x̂ (column sums in a fixed order through `partial`:
// rmsnorm_backward_partial_floats(T, D) floats of scratch).
int64_t rmsnorm_backward_partial_floats(int64_t T, int64_t D);
void launch_rmsnorm_backward(const float* x, const float* w, const float* rstd, const float* dy,
                             float* dx, bool accumulate_dx, bf16* dx_bf16, float* dw,
                             float* partial, int64_t T, int64_t D, cudaStream_t stream);

// reductions.cu
int64_t column_sum_partial_floats(int64_t T, int64_t D);
// out[j] += Σ_t in[t, j] (each chunk of rows in order, then the chunks in a fixed tree).
void launch_column_sum_accumulate(const float* in, int64_t T, int64_t D, float* partial, float* out,
                                  cudaStream_t stream);
// out[j] += Σ_c partial[c, j] over `chunks` rows of D partial sums, in a fixed tree.
void launch_column_finish(const float* partial, int64_t chunks, int64_t D, float* out,
                          cudaStream_t stream);
// *out = Σ x[i] (scale·) or Σ x[i]² – one fixed-shape two-pass reduction; `partial`: 1024 floats.
void launch_sum(const float* x, int64_t n, bool squares, float scale, float* partial, float* out,
                cudaStream_t stream);

// rope.cu: table[p·D/2 + i] = (cos θ, sin θ), θ = p·base^(−2i/D) (in double, rounded to float), for
// positions p < n_pos; out = R(±θ)·in per (row, head) pair of channels, the rows' positions from
// `positions` (each < the table's n_pos); the backward is the inverse rotation.
void launch_rope_table(int64_t n_pos, int64_t D, double base, float2* table, cudaStream_t stream);
// `in` is [T, heads·D]; out's rows are out_ld elements apart (heads·D, or a column block of a
// wider matrix).
void launch_rope_to_bf16(const float* in, bf16* out, int64_t out_ld, const int32_t* positions,
                         const float2* table, int64_t T, int64_t heads, int64_t D, bool inverse,
                         cudaStream_t stream);

// gates.cu: z [T, 3H] (column h·3 + c) + bias → g_raw [T, 3H] (sigmoid, or softmax over the three
// branches of a head) and gate[c] [T, H] in bf16, zero for a disabled branch.
void launch_gate_forward(const float* z, const float* bias, bool softmax, const bool enabled[3],
                         float* g_raw, bf16* const gate[3], int64_t T, int64_t H,
                         cudaStream_t stream);
// dz [T, 3H] from d_gate[c] [T, H] (a disabled branch's gate is a constant: no gradient).
void launch_gate_backward(const float* g_raw, const float* const d_gate[3], bool softmax,
                          const bool enabled[3], float* dz, int64_t T, int64_t H,
                          cudaStream_t stream);

// decode_inputs.cu: one decode step's attention inputs from the fused projection proj [B, width]
// = [q (H·dk) | k of branch c at k_offset[c] (G·dk) | v of branch c at v_offset[c] (G·dv) | gate
// logits at gate_offset (3H, column h·3 + c)]: q and k rotated at positions[b] (as
// launch_rope_to_bf16), v converted, gates as launch_gate_forward. A null k[c] / v[c] skips the
// branch (shared K/V, or dense decoding); a null gate[0] skips the gates.
struct DecodeInputs {
  int64_t width, H, G, dk, dv;
  int64_t k_offset[3], v_offset[3], gate_offset;
  bool softmax, enabled[3];
  bf16* q;
  bf16* k[3];
  bf16* v[3];
  bf16* gate[3];
};
void launch_decode_inputs(const float* proj, const DecodeInputs& in, const int32_t* positions,
                          const float* gate_bias, double rope_base, int64_t B, cudaStream_t stream);
// The projection's row layout (no buffers: q, k, v and gate null, enabled all true): q, then k of
// every branch c with kv[c] at an even row, their v, then the gate logits at a multiple of 3 (zero
// rows between where that pads; gates false: none, gate_offset −1), so that the one-kernel
// inputs (decode_projection.h) take every layout. The decoder's and its tests' one layout.
DecodeInputs decode_inputs_layout(int64_t H, int64_t G, int64_t dk, int64_t dv, const bool kv[3],
                                  bool gates, bool softmax);

// swiglu.cu: m = silu(u1)·u3 (u3 == nullptr: m = silu(u1)); backward from bf16 dm (W2's
// input-gradient GEMM writes it in bf16: half the bytes of fp32 both ways) into bf16 du1, du3 and,
// when m is given, m again (the forward's bits: the backward needs it for W2's gradient and reads
// u1 and u3 anyway).
void launch_swiglu_forward(const bf16* u1, const bf16* u3, bf16* m, int64_t n, cudaStream_t stream);
void launch_swiglu_backward(const bf16* u1, const bf16* u3, const bf16* dm, bf16* du1, bf16* du3,
                            bf16* m, int64_t n, cudaStream_t stream);

// cross_entropy.cu: row_loss[t] = logsumexp(logits[t]) − logits[t, targets[t]]; when dlogits is
// given, dlogits[t] = (softmax(logits[t]) − onehot)·grad_scale in bf16.
void launch_cross_entropy(const float* logits, const int32_t* targets, int64_t T, int64_t V,
                          float grad_scale, float* row_loss, bf16* dlogits, cudaStream_t stream);

// add_into.cu: dst[i] += src[i].
void launch_add_into(const float* src, float* dst, int64_t n, cudaStream_t stream);

// finite_check.cu (anomaly mode): hit->index = the smallest i with x[i] NaN or ±Inf (all bits
// set when there is none) and hit->value = x[i] as float. The caller reads `hit` back.
struct NonFiniteHit {
  unsigned long long index;
  float value;
};
void launch_find_nonfinite(const float* x, int64_t n, NonFiniteHit* hit, cudaStream_t stream);
void launch_find_nonfinite(const bf16* x, int64_t n, NonFiniteHit* hit, cudaStream_t stream);

// sel_distance_hist.cu: hist[k] += how many of the selected blocks sel_idx [T, groups, n_sel]
// were freely chosen (not padding, not the forced blocks 0, c−1 and c, where c is the query's
// block positions[t] / l_sel) and lie 2^k ≤ c − block < 2^(k+1) blocks back (k capped at the last
// bucket) – ModelStats::sel_distance_hist of the CPU model.
constexpr int kSelDistanceBuckets = 16;
void launch_sel_distance_hist(const int32_t* sel_idx, const int32_t* positions, int64_t T,
                              int64_t groups, int64_t n_sel, int64_t l_sel,
                              unsigned long long* hist, cudaStream_t stream);

}  // namespace nsa::cuda
