// The decode step's attention inputs in one kernel (see decode_projection.h). A CTA computes kCols
// consecutive columns of the projection, a warp each (gemv_warp.cuh: the W rows prefetched before
// the wait, the normalised rows staged after it), leaves the sums in shared memory, and then the
// threads that lead a rotated pair, a v element or a head's gate triple finish it with
// decode_inputs.cuh's math. The rotary angles and the gate bias are fetched before the wait.
#include "cuda/common/cuda_check.h"
#include "cuda/common/dependent_launch.cuh"
#include "cuda/common/dynamic_smem.h"
#include "model/cuda/decode_inputs.cuh"
#include "model/cuda/decode_projection.h"
#include "model/cuda/gemv_warp.cuh"
#include "nsa/error.h"

namespace nsa::cuda {
namespace {

using bf16 = __nv_bfloat16;
using namespace gemv_warp;

// Columns per CTA, a warp each: a multiple of 2 and of 3, so that with decode_projection_fits'
// alignment a CTA holds whole rotated pairs (even offsets) and gate triples (offsets 3h).
constexpr int kCols = 6;
constexpr int kThreads = 32 * kCols;
static_assert(kGemvMaxRows * kCols <= kThreads, "a thread per (row, column) of a CTA");

struct ProjectionArgs {
  Operands ops;  // the normalised rows x and W_in
  DecodeInputs in;
  const int32_t* positions;
  const float* gate_bias;
  double rope_base;
};

// What a (row, column) finishes: a rotated pair, one v element, a head's gates – or nothing (the
// second column of a pair or triple, or past the projection).
enum class Lead { kNone, kPair, kValue, kGates };
struct ColumnJob {
  Lead lead = Lead::kNone;
  bf16* dst = nullptr;
  float fc = 0.0f, fs = 0.0f;  // the pair's angle
  float bias[3] = {};          // the head's gate bias
  int64_t head = 0;
};

__device__ ColumnJob column_job(const ProjectionArgs& a, int64_t b, int64_t n) {
  const DecodeInputs& in = a.in;
  ColumnJob job;
  const auto pair = [&](bf16* row, int64_t off) {
    if (off % 2) return;
    job.lead = Lead::kPair;
    job.dst = row + off;
    rope_cos_sin(static_cast<double>(a.positions[b]), (off % in.dk) / 2, in.dk, a.rope_base, false,
                 job.fc, job.fs);
  };
  if (n >= in.width) return job;
  if (n < in.H * in.dk) {
    pair(in.q + b * in.H * in.dk, n);
    return job;
  }
  for (int c = 0; c < 3; ++c) {
    const int64_t off = n - in.k_offset[c];
    if (in.k[c] && off >= 0 && off < in.G * in.dk) {
      pair(in.k[c] + b * in.G * in.dk, off);
      return job;
    }
  }
  for (int c = 0; c < 3; ++c) {
    const int64_t off = n - in.v_offset[c];
    if (in.v[c] && off >= 0 && off < in.G * in.dv) {
      job.lead = Lead::kValue;
      job.dst = in.v[c] + b * in.G * in.dv + off;
      return job;
    }
  }
  const int64_t off = n - in.gate_offset;
  if (in.gate[0] && off >= 0 && off < 3 * in.H && off % 3 == 0) {
    job.lead = Lead::kGates;
    job.head = off / 3;
    for (int c = 0; c < 3; ++c) job.bias[c] = a.gate_bias[off + c];
  }
  return job;
}

template <int BM>
__global__ void __launch_bounds__(kThreads) decode_projection_kernel(const ProjectionArgs a) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int64_t n0 = static_cast<int64_t>(blockIdx.x) * kCols;
  WarpColumn<BM, false> col(a.ops, n0 + warp, n0 + warp < a.in.width, lane);
  extern __shared__ __align__(16) float xs[];  // rows [B, D], norm weight [D]
  __shared__ float sums[BM][kCols];
  stage_norm_weight(a.ops, xs);
  // Thread t's job: row t / kCols, column n0 + t % kCols. Positions are written two or more
  // kernels back (common/dependent_launch.cuh), so the angles come before the wait, as the bias.
  const int64_t b = threadIdx.x / kCols;
  const int c = threadIdx.x % kCols;
  const ColumnJob job = b < a.ops.B ? column_job(a, b, n0 + c) : ColumnJob{};
  wait_for_previous_kernel();  // x comes from the kernel before
  stage_rows(a.ops, xs);
  float acc1[BM], acc3[BM];
  col.template sums<true>(a.ops, xs, lane, acc1, acc3);
#pragma unroll
  for (int r = 0; r < BM; ++r) {
    if (r < a.ops.B && lane == r) sums[r][warp] = acc1[r];
  }
  __syncthreads();
  if (job.lead == Lead::kNone) return;
  const float* s = &sums[b][c];
  if (job.lead == Lead::kPair) {
    store_rotated_pair(s[0], s[1], job.fc, job.fs, job.dst);
  } else if (job.lead == Lead::kValue) {
    *job.dst = __float2bfloat16(s[0]);
  } else {
    float v[3];
    for (int k = 0; k < 3; ++k) v[k] = s[k] + job.bias[k];
    store_head_gates(v, a.in, b, job.head);
  }
}

}  // namespace

bool decode_projection_fits(const GemvInput& x, const bf16* w_in, const DecodeInputs& in, int64_t B,
                            int64_t D) {
  if (!x.x_f32 || !gemv_fits(B, D, x, w_in) || in.dk % 2 != 0) return false;
  for (int c = 0; c < 3; ++c) {
    if (in.k[c] && in.k_offset[c] % 2 != 0) return false;
  }
  return (!in.gate[0] || in.gate_offset % 3 == 0) && in.width > 0 && in.width < (int64_t{1} << 31);
}

void launch_decode_projection(const GemvInput& x, const bf16* w_in, const DecodeInputs& in,
                              const int32_t* positions, const float* gate_bias, double rope_base,
                              int64_t B, int64_t D, cudaStream_t stream) {
  NSA_CHECK(decode_projection_fits(x, w_in, in, B, D), "decode projection: B = ", B, ", D = ", D,
            ", width ", in.width, " (B in [1, ", kGemvMaxRows,
            "], normalised fp32 rows and 16-byte aligned operands as launch_gemv takes, dk even, "
            "k offsets even, the gate offset a multiple of 3); else launch_gemv and "
            "launch_decode_inputs");
  const ProjectionArgs a{Operands{x, w_in, nullptr, static_cast<int>(B), static_cast<int>(D)}, in,
                         positions, gate_bias, rope_base};
  const auto kernel = B <= 1   ? decode_projection_kernel<1>
                      : B <= 2 ? decode_projection_kernel<2>
                               : decode_projection_kernel<4>;
  const size_t smem = staged_bytes(B, D);
  allow_dynamic_smem(kernel, smem);
  const dim3 grid(static_cast<unsigned>((in.width + kCols - 1) / kCols));
  launch_dependent(kernel, grid, dim3(kThreads), smem, stream, a);
}

}  // namespace nsa::cuda
