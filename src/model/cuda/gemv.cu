// Few-row linear layers (see gemv.h): one warp per output column n (a row of W), its lanes
// striding over 128-bit chunks of that row; each lane keeps one fp32 sum per row of x, summed in
// chunk order, then the lanes' sums meet in a butterfly – a fixed order, so the bits do not depend
// on the launch or on the other rows. The first kPrefetch chunks of a lane's W row (all of it up
// to in = 32·8·kPrefetch) load before the kernel waits for its predecessor. With a normalised
// input the CTA first copies the fp32 rows to shared memory (one round trip after the wait; the
// norm weight, which never changes, before it), then every warp takes each row's RMS the way
// rmsnorm_forward_kernel does (lane l sums the squares of column quads l, l + 32, … in order, then
// warp_sum) and forms each chunk of the normalised bf16 row as that kernel would have written it.
#include "cuda/common/block_reduce.cuh"
#include "cuda/common/cuda_check.h"
#include "cuda/common/dependent_launch.cuh"
#include "cuda/common/mma.cuh"
#include "model/cuda/gemv.h"
#include "model/cuda/pointwise.cuh"
#include "model/cuda/vec_access.cuh"
#include "nsa/error.h"

namespace nsa::cuda {
namespace {

using bf16 = __nv_bfloat16;

constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;
constexpr int kChunk = 8;     // bf16 per 128-bit load
constexpr int kPrefetch = 8;  // chunks per lane loaded before the wait (in ≤ 2048: the whole row)
// Normalised input: its B fp32 rows and the norm weight staged in shared memory, up to this.
constexpr size_t kMaxStagedBytes = 200 * 1024;

struct GemvArgs {
  GemvInput x;
  const bf16* w1;  // [out, in]
  const bf16* w3;  // SwiGLU's second weight (null: SiLU / a plain product)
  void* y;         // [B, out]: fp32 or bf16 (plain), bf16 m (SwiGLU)
  bool y_bf16;
  bool accumulate;  // y += (fp32)
  int B, in, out;
  // Decode inputs (Out::kInputs): where the projection's columns go, the positions, the gate bias
  // [H, 3], RoPE's base; the q, k and v columns [0, main_end) over main_ctas CTAs.
  DecodeInputs inputs;
  const int32_t* positions;
  const float* gate_bias;
  double rope_base;
  int64_t main_end;
  int main_ctas;
};

__device__ __forceinline__ uint4 load_chunk(const uint4* row, int c, int chunks) {
  return c < chunks ? __ldg(row + c) : make_uint4(0, 0, 0, 0);
}

// 1 / RMS of each fp32 row b < B of xs (the rows staged in shared memory; rmsnorm_forward_kernel's
// arithmetic: the same bits).
template <int BM>
__device__ __forceinline__ void row_rstd(const GemvArgs& a, const float* xs, int lane,
                                         float r[BM]) {
#pragma unroll
  for (int b = 0; b < BM; ++b) {
    if (b >= a.B) break;  // warp-uniform
    const float* row = xs + static_cast<int64_t>(b) * a.in;
    float ss = 0.0f;
    for (int q = lane; q < a.in / 4; q += 32) {
      const float4 v = reinterpret_cast<const float4*>(row)[q];
      ss = __fadd_rn(ss, __fmul_rn(v.x, v.x));
      ss = __fadd_rn(ss, __fmul_rn(v.y, v.y));
      ss = __fadd_rn(ss, __fmul_rn(v.z, v.z));
      ss = __fadd_rn(ss, __fmul_rn(v.w, v.w));
    }
    r[b] = rsqrtf(warp_sum(ss) / static_cast<float>(a.in) + a.x.eps);
  }
}

// acc1[b] (acc3[b]) += x[b, chunk c] · the W1 (W3) chunk, for the rows b < B (warp-uniform),
// elements in order; x's chunk is the bf16 row's, or the normalised fp32 row's (xs, with the norm
// weight after the rows, in shared memory) rounded to bf16.
template <int BM, bool kNorm>
__device__ __forceinline__ void accumulate(const GemvArgs& a, const float* xs, int c,
                                           const float r[BM], const uint4& w1, const uint4& w3,
                                           bool two, float acc1[BM], float acc3[BM]) {
  float f1[kChunk], f3[kChunk], nw[kChunk];
  unpack_bf16x8(w1, f1);
  if (two) unpack_bf16x8(w3, f3);
  if (kNorm) load_f32x8<false>(xs + static_cast<int64_t>(a.B) * a.in + kChunk * c, nw);
#pragma unroll
  for (int b = 0; b < BM; ++b) {
    if (b >= a.B) break;
    const int64_t at = static_cast<int64_t>(b) * a.in + kChunk * c;
    float xf[kChunk];
    if (kNorm) {
      load_f32x8<false>(xs + at, xf);
#pragma unroll
      for (int k = 0; k < kChunk; ++k)
        xf[k] = __bfloat162float(__float2bfloat16(rms_normed(xf[k], r[b], nw[k])));
    } else {
      unpack_bf16x8(__ldg(reinterpret_cast<const uint4*>(a.x.x + at)), xf);
    }
#pragma unroll
    for (int k = 0; k < kChunk; ++k) acc1[b] = fmaf(xf[k], f1[k], acc1[b]);
    if (two) {
#pragma unroll
      for (int k = 0; k < kChunk; ++k) acc3[b] = fmaf(xf[k], f3[k], acc3[b]);
    }
  }
}

// What a kernel writes: y (plain), m = swiglu(x·W1ᵀ, x·W3ᵀ), or the decode step's attention inputs
// from the fused input projection (model_ops.h's DecodeInputs, decode_inputs.cu's arithmetic).
enum class Out { kPlain, kSwiglu, kInputs };

// The decode inputs' column of a warp: CTAs below main_ctas take the columns [0, main_end) (q, k,
// v) kWarps at a time – a rotary pair (2i, 2i + 1 of a head) never straddles two CTAs, every
// offset being even – and each CTA after them one head's three gate logits (warps 0..2), which
// the gates need together.
struct InputColumn {
  int64_t n;
  bool live, gate;
};

__device__ __forceinline__ InputColumn input_column(const GemvArgs& a, int warp) {
  if (static_cast<int>(blockIdx.x) < a.main_ctas) {
    const int64_t n = static_cast<int64_t>(blockIdx.x) * kWarps + warp;
    return InputColumn{n, n < a.main_end, false};
  }
  const int64_t h = blockIdx.x - a.main_ctas;
  return InputColumn{a.inputs.gate_offset + 3 * h + warp, warp < 3, true};
}

// Where column n (< main_end) of row b goes: q or a branch's k (rotated: pair i of its head) or v.
struct InputTarget {
  bf16* dst;  // row 0's element; row b at dst + b·stride
  int64_t stride;
  int pair;  // −1: no rotation
};

__device__ __forceinline__ InputTarget input_target(const DecodeInputs& in, int64_t n) {
  if (n < in.H * in.dk) return InputTarget{in.q + n, in.H * in.dk, static_cast<int>(n % in.dk / 2)};
  for (int c = 0; c < 3; ++c) {
    const int64_t k = n - in.k_offset[c], v = n - in.v_offset[c];
    if (in.k[c] && k >= 0 && k < in.G * in.dk)
      return InputTarget{in.k[c] + k, in.G * in.dk, static_cast<int>(k % in.dk / 2)};
    if (in.v[c] && v >= 0 && v < in.G * in.dv) return InputTarget{in.v[c] + v, in.G * in.dv, -1};
  }
  return InputTarget{nullptr, 0, -1};
}

// BM: rows of x the sums are kept for (B ≤ BM); kOut: what goes out (kSwiglu: two W rows per
// column); kNorm: x is fp32 and RMS-normalised on the way.
template <int BM, Out kOut, bool kNorm>
__global__ void __launch_bounds__(kThreads) gemv_kernel(const GemvArgs a) {
  constexpr bool kSwiglu = kOut == Out::kSwiglu, kInputs = kOut == Out::kInputs;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  InputColumn col{static_cast<int64_t>(blockIdx.x) * kWarps + warp, false, false};
  if (kInputs) {
    col = input_column(a, warp);
  } else {
    col.live = col.n < a.out;
  }
  const int64_t n = col.n;
  const bool live = col.live;
  const int chunks = a.in / kChunk;
  const bool two = kSwiglu && a.w3;
  const uint4* w1 = reinterpret_cast<const uint4*>(a.w1) + (live ? n : 0) * chunks;
  const uint4* w3 = two ? reinterpret_cast<const uint4*>(a.w3) + (live ? n : 0) * chunks : nullptr;
  const int have = live ? chunks : 0;
  uint4 pre1[kPrefetch], pre3[kPrefetch];
#pragma unroll
  for (int u = 0; u < kPrefetch; ++u) {
    pre1[u] = load_chunk(w1, lane + 32 * u, have);
    pre3[u] = two ? load_chunk(w3, lane + 32 * u, have) : make_uint4(0, 0, 0, 0);
  }
  // Decode inputs: lane b < B's rotary angle or gate bias, before the wait (positions are written
  // two or more kernels back: common/dependent_launch.cuh; the bias is a weight).
  InputTarget target{nullptr, 0, -1};
  float fc = 1.0f, fs = 0.0f, bias[3] = {0.0f, 0.0f, 0.0f};
  if (kInputs && live && lane < a.B) {
    if (col.gate) {  // warp 0 gates the head: it takes the three biases
      for (int c = 0; c < 3 && warp == 0; ++c) bias[c] = a.gate_bias[n - a.inputs.gate_offset + c];
    } else {
      target = input_target(a.inputs, n);
      if (target.pair >= 0)
        rope_cos_sin(static_cast<double>(a.positions[lane]), target.pair, a.inputs.dk, a.rope_base,
                     false, fc, fs);
    }
  }
  // Normalised input: rows [B, in] then the norm weight [in], staged (16-byte copies: in % 8 == 0).
  extern __shared__ __align__(16) float xs[];
  const int64_t row_quads = static_cast<int64_t>(a.B) * a.in / 4;
  if (kNorm) {
    for (int64_t i = threadIdx.x; i < a.in / 4; i += blockDim.x)
      cp_async16(xs + 4 * (row_quads + i), a.x.norm_w + 4 * i);
  }
  wait_for_previous_kernel();  // x (and y) come from the kernels before
  if (kNorm) {
    for (int64_t i = threadIdx.x; i < row_quads; i += blockDim.x)
      cp_async16(xs + 4 * i, a.x.x_f32 + 4 * i);
    cp_async_commit();
    cp_async_wait<0>();
    __syncthreads();
  }
  if (!kInputs && !live) return;  // warp-uniform (the decode inputs meet at a barrier below)
  float acc1[BM], acc3[BM];
#pragma unroll
  for (int b = 0; b < BM; ++b) acc1[b] = 0.0f, acc3[b] = 0.0f;
  if (live) {
    float r[BM] = {};
    if (kNorm) row_rstd<BM>(a, xs, lane, r);
#pragma unroll
    for (int u = 0; u < kPrefetch; ++u) {
      const int c = lane + 32 * u;
      if (c < chunks) accumulate<BM, kNorm>(a, xs, c, r, pre1[u], pre3[u], two, acc1, acc3);
    }
    for (int c = lane + 32 * kPrefetch; c < chunks; c += 32) {
      const uint4 v1 = __ldg(w1 + c);
      const uint4 v3 = two ? __ldg(w3 + c) : make_uint4(0, 0, 0, 0);
      accumulate<BM, kNorm>(a, xs, c, r, v1, v3, two, acc1, acc3);
    }
#pragma unroll
    for (int b = 0; b < BM; ++b) {
      acc1[b] = warp_sum(acc1[b]);  // every lane gets the same bits
      if (two) acc3[b] = warp_sum(acc3[b]);
    }
  }
  if constexpr (kInputs) {
    // The CTA's columns meet in shared memory: a rotary pair's two, a head's three gate logits.
    __shared__ float sums[kWarps][BM];
#pragma unroll
    for (int b = 0; b < BM; ++b) {
      if (live && lane == b) sums[warp][b] = acc1[b];
    }
    __syncthreads();
    if (!live || lane >= a.B) return;
    const int b = lane;
    if (col.gate) {  // decode_inputs.cu's gates: logits plus bias, then sigmoid or softmax
      if (warp != 0) return;
      const int64_t h = (n - a.inputs.gate_offset) / 3;
      float v[3];
      for (int c = 0; c < 3; ++c) v[c] = sums[c][b] + bias[c];
      gate_values(v, a.inputs.softmax);
      for (int c = 0; c < 3; ++c)
        a.inputs.gate[c][b * a.inputs.H + h] = __float2bfloat16(a.inputs.enabled[c] ? v[c] : 0.0f);
      return;
    }
    float y = sums[warp][b];
    if (target.pair >= 0) {
      const float2 r2 = rope_rotate(sums[warp & ~1][b], sums[warp | 1][b], fc, fs);
      y = warp & 1 ? r2.y : r2.x;
    }
    target.dst[b * target.stride] = __float2bfloat16(y);
    return;
  } else {
#pragma unroll
    for (int b = 0; b < BM; ++b) {
      if (b >= a.B || lane != b) continue;
      const int64_t i = static_cast<int64_t>(b) * a.out + n;
      if (kSwiglu) {  // u1, u3 rounded to bf16 as the GEMMs' bf16 results, then m's arithmetic
        const float u1 = __bfloat162float(__float2bfloat16(acc1[b]));
        const float u3 = two ? __bfloat162float(__float2bfloat16(acc3[b])) : 1.0f;
        static_cast<bf16*>(a.y)[i] = __float2bfloat16(swiglu_value(u1, u3));
      } else if (a.y_bf16) {
        static_cast<bf16*>(a.y)[i] = __float2bfloat16(acc1[b]);
      } else {
        float* y = static_cast<float*>(a.y);
        y[i] = a.accumulate ? y[i] + acc1[b] : acc1[b];
      }
    }
  }
}

size_t staged_bytes(int64_t B, int64_t in) {
  return static_cast<size_t>((B + 1) * in) * sizeof(float);
}

template <Out kOut, bool kNorm>
void launch_rows(const GemvArgs& a, unsigned ctas, cudaStream_t stream) {
  static_assert(kGemvMaxRows == 4, "one kernel per power of two up to kGemvMaxRows");
  const auto kernel = a.B <= 1   ? gemv_kernel<1, kOut, kNorm>
                      : a.B <= 2 ? gemv_kernel<2, kOut, kNorm>
                                 : gemv_kernel<4, kOut, kNorm>;
  const size_t smem = kNorm ? staged_bytes(a.B, a.in) : 0;
  if (smem > 48 * 1024) {
    NSA_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        static_cast<int>(kMaxStagedBytes)));
  }
  launch_dependent(kernel, dim3(ctas), dim3(kThreads), smem, stream, a);
}

template <Out kOut>
void launch(const GemvArgs& a, cudaStream_t stream) {
  if (a.B == 0 || a.out == 0) return;
  const unsigned ctas = static_cast<unsigned>((a.out + kWarps - 1) / kWarps);
  if (a.x.x_f32) {
    launch_rows<kOut, true>(a, ctas, stream);
  } else {
    launch_rows<kOut, false>(a, ctas, stream);
  }
}

void check_args(int64_t B, int64_t in, int64_t out, const GemvInput& x, const bf16* w,
                const bf16* w3, const char* what) {
  NSA_CHECK(
      gemv_fits(B, in, x, w, w3), what, ": B = ", B, " rows and in = ", in, " (B in [1, ",
      kGemvMaxRows,
      "], in a multiple of 8 below 2^31, 16-byte aligned operands, the rows bf16 or fp32 with "
      "a norm weight; else use Gemm)");
  NSA_CHECK(out >= 0 && out < (int64_t{1} << 31), what, ": out = ", out, " outside [0, 2^31)");
}

}  // namespace

bool gemv_fits(int64_t B, int64_t in, const GemvInput& x, const bf16* w, const bf16* w3) {
  const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  const bool rows =
      x.x_f32 ? !x.x && x.norm_w && aligned(x.x_f32) && aligned(x.norm_w) : x.x && aligned(x.x);
  return rows && B >= 1 && B <= kGemvMaxRows && in > 0 && in % kChunk == 0 &&
         in < (int64_t{1} << 31) && w && aligned(w) && (!w3 || aligned(w3)) &&
         (!x.x_f32 || staged_bytes(B, in) <= kMaxStagedBytes);
}

void launch_gemv(const GemvInput& x, const bf16* w, GemmOut y, int64_t B, int64_t in, int64_t out,
                 float beta, cudaStream_t stream) {
  check_args(B, in, out, x, w, nullptr, "launch_gemv");
  NSA_CHECK(beta == 0.0f || (beta == 1.0f && !y.bf16),
            "launch_gemv: beta must be 0, or 1 with an fp32 result (got ", beta, ")");
  GemvArgs a{};
  a.x = x, a.w1 = w, a.y = y.ptr, a.y_bf16 = y.bf16, a.accumulate = beta == 1.0f;
  a.B = static_cast<int>(B), a.in = static_cast<int>(in), a.out = static_cast<int>(out);
  launch<Out::kPlain>(a, stream);
}

void launch_gemv_swiglu(const GemvInput& x, const bf16* w1, const bf16* w3, bf16* m, int64_t B,
                        int64_t in, int64_t out, cudaStream_t stream) {
  check_args(B, in, out, x, w1, w3, "launch_gemv_swiglu");
  GemvArgs a{};
  a.x = x, a.w1 = w1, a.w3 = w3, a.y = m, a.y_bf16 = true;
  a.B = static_cast<int>(B), a.in = static_cast<int>(in), a.out = static_cast<int>(out);
  launch<Out::kSwiglu>(a, stream);
}

void launch_gemv_decode_inputs(const GemvInput& x, const bf16* w, const DecodeInputs& in,
                               const int32_t* positions, const float* gate_bias, double rope_base,
                               int64_t B, int64_t D, cudaStream_t stream) {
  check_args(B, D, in.width, x, w, nullptr, "launch_gemv_decode_inputs");
  NSA_CHECK(x.x_f32, "launch_gemv_decode_inputs: the rows must be normalised on the way");
  const bool gates = in.gate[0] != nullptr;
  const int64_t main_end = gates ? in.gate_offset : in.width;
  NSA_CHECK(main_end % (2 * kWarps) == 0 && in.dk % 2 == 0 && (!gates || gate_bias),
            "launch_gemv_decode_inputs: the q, k and v columns (", main_end,
            ") must be a multiple of ", 2 * kWarps, ", dk even, the gate bias given");
  if (B == 0) return;
  GemvArgs a{};
  a.x = x, a.w1 = w, a.B = static_cast<int>(B), a.in = static_cast<int>(D);
  a.out = static_cast<int>(in.width);
  a.inputs = in, a.positions = positions, a.gate_bias = gate_bias, a.rope_base = rope_base;
  a.main_end = main_end;
  a.main_ctas = static_cast<int>(main_end / kWarps);
  const unsigned ctas = static_cast<unsigned>(a.main_ctas + (gates ? in.H : 0));
  launch_rows<Out::kInputs, true>(a, ctas, stream);
}

}  // namespace nsa::cuda
