// Batched prefill of the NSA decode caches (NsaDecodeCuda::prefill, nsa_decode.h;
// docs/inference.md, "Prefill"): a packed forward over whole prompts has already computed every
// prompt token's rotated K/V; these kernels write them where the prompts' append steps would have
// – the selected branch's rows, the last w rows into the window ring, the last l into the raw ring
// of the compressed branch – and compute every compressed token a prompt completes, with append's
// arithmetic (fp32 sum of the l bf16 rows oldest first, times 1/l, rounded to bf16), so the caches
// hold bit for bit what token-by-token decoding would leave.
//
// Two kernels, no serial loop over a prompt: rows (B' prompts × chunks of kRows rows, 16-byte
// copies) and compressed tokens (B' prompts × their compressed tokens, one CTA each).
#include <algorithm>

#include "decode_params.cuh"
#include "nsa_decode.h"

namespace nsa::cuda {
namespace {

using bf16 = __nv_bfloat16;
constexpr int kRows = 32, kThreads = 256;

struct PrefillParams {
  int G, dk, dv, l, d, w;
  int64_t max_len, max_cmp;
  bool dense;
  const bf16* k_in[kNumBranches];  // [T, G, dk], packed prompts
  const bf16* v_in[kNumBranches];  // [T, G, dv]
  const int64_t* cu_seqlens;       // [n + 1]
  const int32_t* seqs;             // [n] the decoder sequence of each prompt
  // The caches, [B, G, rows, dk|dv] (nsa_decode.h).
  bf16 *k_sel, *v_sel, *k_win, *v_win, *k_raw, *v_raw, *k_cmp, *v_cmp;
};

// Element e of row r (e < G·dim: group e / dim) of sequence b in a cache (cache_row,
// decode_params.cuh) – the inputs' row [G, dim] spread over the groups' rows.
__device__ __forceinline__ int64_t cache_offset(const PrefillParams& p, int b, int64_t rows,
                                                int64_t r, int e, int dim) {
  const int g = e / dim;
  return decode::cache_row(b, g, p.G, rows, r) * dim + (e - g * dim);
}

__global__ void prefill_rows_kernel(const PrefillParams p) {
  const int i = blockIdx.y;
  const int64_t start = p.cu_seqlens[i], S = p.cu_seqlens[i + 1] - start;
  const int64_t t0 = static_cast<int64_t>(blockIdx.x) * kRows;
  if (t0 >= S) return;
  const int b = p.seqs[i];
  const int rows = static_cast<int>(min(static_cast<int64_t>(kRows), S - t0));
  const int nk = p.G * p.dk / 8, nv = p.G * p.dv / 8;  // 16-byte pieces of a K and a V row
  for (int idx = threadIdx.x; idx < rows * (nk + nv); idx += blockDim.x) {
    const int64_t t = t0 + idx / (nk + nv);
    const int j = idx % (nk + nv);
    const bool is_k = j < nk;
    const int piece = is_k ? j : j - nk;
    const int64_t width = static_cast<int64_t>(p.G) * (is_k ? p.dk : p.dv);
    const auto load = [&](const bf16* base) {
      return reinterpret_cast<const uint4*>(base + (start + t) * width)[piece];
    };
    const int dim = is_k ? p.dk : p.dv;
    const auto store = [&](bf16* base, int64_t rows_per_seq, int64_t r, uint4 value) {
      *reinterpret_cast<uint4*>(base + cache_offset(p, b, rows_per_seq, r, 8 * piece, dim)) = value;
    };
    store(is_k ? p.k_sel : p.v_sel, p.max_len, t, load(is_k ? p.k_in[kSel] : p.v_in[kSel]));
    if (p.dense) continue;
    if (t >= S - p.w) {
      store(is_k ? p.k_win : p.v_win, p.w, t % p.w, load(is_k ? p.k_in[kWin] : p.v_in[kWin]));
    }
    if (t >= S - p.l) {
      store(is_k ? p.k_raw : p.v_raw, p.l, t % p.l, load(is_k ? p.k_in[kCmp] : p.v_in[kCmp]));
    }
  }
}

// Compressed token j of prompt blockIdx.y (φ = avg over positions j·d .. j·d + l − 1): the sum and
// rounding of append_kernel (nsa_decode.cu), element by element.
__global__ void prefill_compress_kernel(const PrefillParams p) {
  const int i = blockIdx.y;
  const int64_t start = p.cu_seqlens[i], S = p.cu_seqlens[i + 1] - start;
  const int64_t j = blockIdx.x;
  const int64_t nc = S < p.l ? 0 : (S - p.l) / p.d + 1;
  if (j >= nc) return;
  const int b = p.seqs[i];
  const float inv_l = 1.0f / static_cast<float>(p.l);
  const int kw = p.G * p.dk, vw = p.G * p.dv;
  for (int idx = threadIdx.x; idx < kw + vw; idx += blockDim.x) {
    const bool is_k = idx < kw;
    const int e = is_k ? idx : idx - kw;
    const int64_t width = is_k ? kw : vw;
    const bf16* src = (is_k ? p.k_in[kCmp] : p.v_in[kCmp]) + (start + j * p.d) * width + e;
    float s = 0.0f;
    for (int r = 0; r < p.l; ++r) s += __bfloat162float(src[r * width]);
    (is_k ? p.k_cmp : p.v_cmp)[cache_offset(p, b, p.max_cmp, j, e, is_k ? p.dk : p.dv)] =
        __float2bfloat16(s * inv_l);
  }
}

}  // namespace

void NsaDecodeCuda::prefill(const bf16* const k[kNumBranches], const bf16* const v[kNumBranches],
                            const int64_t* cu_seqlens, const int32_t* seqs, int64_t n,
                            int64_t max_prompt, cudaStream_t stream) {
  const NsaConfig& c = cfg_;
  NSA_CHECK(n >= 1 && n <= B_, "decode prefill: ", n, " prompts for a batch of ", B_);
  NSA_CHECK(max_prompt >= 1 && max_prompt <= max_len_, "decode prefill: a prompt of ", max_prompt,
            " tokens does not fit caches of ", max_len_);
  PrefillParams p{};
  p.G = static_cast<int>(c.groups), p.dk = static_cast<int>(c.dk), p.dv = static_cast<int>(c.dv);
  p.l = static_cast<int>(c.l), p.d = static_cast<int>(c.d), p.w = static_cast<int>(c.w);
  p.max_len = max_len_, p.max_cmp = max_cmp_, p.dense = dense_;
  for (int br = 0; br < kNumBranches; ++br) {
    p.k_in[br] = k[c.kv_index(br)];
    p.v_in[br] = v[c.kv_index(br)];
  }
  p.cu_seqlens = cu_seqlens, p.seqs = seqs;
  p.k_sel = k_sel_.get(), p.v_sel = v_sel_.get(), p.k_win = k_win_.get(), p.v_win = v_win_.get();
  p.k_raw = k_raw_.get(), p.v_raw = v_raw_.get(), p.k_cmp = k_cmp_.get(), p.v_cmp = v_cmp_.get();
  const dim3 rows_grid(static_cast<unsigned>((max_prompt + kRows - 1) / kRows),
                       static_cast<unsigned>(n));
  prefill_rows_kernel<<<rows_grid, kThreads, 0, stream>>>(p);
  NSA_CUDA_LAUNCH_CHECK();
  const int64_t max_nc = c.num_compressed(max_prompt);
  if (dense_ || max_nc == 0) return;
  const dim3 cmp_grid(static_cast<unsigned>(max_nc), static_cast<unsigned>(n));
  prefill_compress_kernel<<<cmp_grid, kThreads, 0, stream>>>(p);
  NSA_CUDA_LAUNCH_CHECK();
}

void NsaDecodeCuda::copy_sequence(int64_t from, int64_t to, int64_t len, cudaStream_t stream) {
  NSA_CHECK(from >= 0 && from < B_ && to >= 0 && to < B_, "decode: sequences ", from, " and ", to,
            " must lie in [0, ", B_, ")");
  NSA_CHECK(len >= 0 && len <= max_len_, "decode: ", len, " tokens do not fit caches of ",
            max_len_);
  if (from == to) return;
  const NsaConfig& c = cfg_;
  // The first `rows` rows of each group's [rows_per_seq, dim] block (caches [B, G, rows, dim]).
  const auto copy = [&](DeviceBuffer<bf16>& buf, int64_t rows_per_seq, int64_t rows, int64_t dim) {
    if (rows == 0 || buf.size() == 0) return;
    const int64_t seq = c.groups * rows_per_seq * dim;  // one sequence's elements
    const size_t pitch = static_cast<size_t>(rows_per_seq * dim) * sizeof(bf16);
    NSA_CUDA_CHECK(cudaMemcpy2DAsync(buf.get() + to * seq, pitch, buf.get() + from * seq, pitch,
                                     static_cast<size_t>(rows * dim) * sizeof(bf16),
                                     static_cast<size_t>(c.groups), cudaMemcpyDeviceToDevice,
                                     stream));
  };
  copy(k_sel_, max_len_, len, c.dk);
  copy(v_sel_, max_len_, len, c.dv);
  if (dense_) return;
  copy(k_win_, c.w, c.w, c.dk);
  copy(v_win_, c.w, c.w, c.dv);
  copy(k_raw_, c.l, c.l, c.dk);
  copy(v_raw_, c.l, c.l, c.dv);
  copy(k_cmp_, max_cmp_, c.num_compressed(len), c.dk);
  copy(v_cmp_, max_cmp_, c.num_compressed(len), c.dv);
}

}  // namespace nsa::cuda
