// A decode part's attention (tile_attend, src/cuda/nsa/decode_tile.cuh) timed alone: one CTA of
// the decode kernels' shape, its tile staged once in shared memory, the attention called back to
// back – the dependent latency every decode part pays at batch 1 (docs/perf.md, twenty-sixth
// session: 3,134 cycles a 128-key part before the warps attended their own keys, 1,525 after), here
// with nothing else on the GPU and no memory round trip.
// Each call sits between two barriers; thread 0 reads clock64 and %globaltimer around it and at the
// attention's phase hooks (S = Q·Kᵀ; softmax and P·V; the fold of the warps' partials); each row's
// first call is reported apart from the median (its code is cold in the first row only). The keys
// are staged again before every call (outside the timed span): the attention writes its partials
// over the values. Values are random; the cost does not depend on them. Benchmarks only. With
// --ctas N, then N CTAs at once, each its calls back to back (staged once): ns a part across the
// GPU – the throughput that batch 16 pays, where the latency table shows what batch 1 pays.
//   nsa_decode_tile [--hpg 6] [--dk 64] [--dv 64] [--keys 128,64,16] [--reps 200] [--ctas N]
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "cuda/common/cuda_check.h"
#include "cuda/nsa/decode_tile.cuh"
#include "guarded_main.h"
#include "options.h"
#include "phase_cycles.h"

namespace {

using nsa::cuda::decode::DecodeDims;
using nsa::cuda::decode::Tile;

// Stages q [hpg, dk] (rows ≥ hpg zero) or, with keys_only, `count` rows of the keys [kPartKeys, dk]
// and values [kPartKeys, dv] (rows count .. round16(count) − 1 zero), from global memory.
__device__ void stage(const DecodeDims& m, const Tile& tl, int count, const __nv_bfloat16* q,
                      const __nv_bfloat16* k, const __nv_bfloat16* v, bool keys_only) {
  using nsa::cuda::decode::key_at;
  const __nv_bfloat16 zero = __float2bfloat16(0.0f);
  if (!keys_only) {
    for (int i = threadIdx.x; i < nsa::cuda::decode::kMaxHeadsPerGroup * m.dk; i += blockDim.x) {
      const int r = i / m.dk, e = i % m.dk;
      tl.q[r * tl.qs + e] = r < m.hpg ? q[i] : zero;
    }
  }
  const int rows = nsa::cuda::decode::round16(count);
  for (int i = threadIdx.x; i < rows * m.dk; i += blockDim.x) {
    const int c = i / m.dk, e = i % m.dk;
    key_at(tl, c, e / 8)[e % 8] = c < count ? k[i] : zero;
  }
  for (int i = threadIdx.x; i < rows * m.dv; i += blockDim.x) {
    const int c = i / m.dv, e = i % m.dv;
    tl.v[c * tl.vs + e] = c < count ? v[i] : zero;
  }
}

// Thread 0's clock at tile_attend's phase hooks (decode_tile.cuh NoStamps): after S = Q·Kᵀ and
// after warp 0's partial is written.
struct ClockStamps {
  long long* at;
  __device__ __forceinline__ void operator()(int phase) const {
    if (threadIdx.x == 0) at[phase] = clock64();
  }
};

constexpr int kPhases = 4;  // start, S computed, partial written, end (after the closing barrier)

// `reps` calls of the attention in each CTA. restage: the keys and values staged again before
// every call (outside the timed span; the latency table), else staged once (the throughput table:
// the cost does not depend on the values, which the partials overwrite). CTA 0 writes the stamps
// and the globaltimer total; each CTA its own ml and o.
__global__ void __launch_bounds__(nsa::cuda::decode::kPartThreads)
    attend_loop(DecodeDims m, int count, int reps, bool restage, const __nv_bfloat16* q,
                const __nv_bfloat16* k, const __nv_bfloat16* v, float* ml, float* o,
                long long* stamps, unsigned long long* ns) {
  extern __shared__ __align__(16) unsigned char smem[];
  __shared__ long long at[kPhases];
  const Tile tl = nsa::cuda::decode::carve_tile(smem, m.dk, m.dv);
  const bool record = blockIdx.x == 0 && threadIdx.x == 0;
  ml += static_cast<int64_t>(blockIdx.x) * 2 * nsa::cuda::decode::kMaxHeadsPerGroup;
  o += static_cast<int64_t>(blockIdx.x) * nsa::cuda::decode::kMaxHeadsPerGroup * m.dv;
  stage(m, tl, count, q, k, v, false);
  unsigned long long total = 0;
  for (int r = 0; r < reps; ++r) {
    if (restage) stage(m, tl, count, q, k, v, true);
    __syncthreads();
    unsigned long long g0, g1;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(g0));
    if (threadIdx.x == 0) at[0] = clock64();
    nsa::cuda::decode::tile_attend_part<false>(m, tl, count, nsa::cuda::decode::ScoresOut{}, ml, o,
                                               ClockStamps{at});
    __syncthreads();
    if (threadIdx.x == 0) at[3] = clock64();
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(g1));
    if (record) {
      for (int i = 1; i < kPhases; ++i) stamps[r * (kPhases - 1) + i - 1] = at[i] - at[i - 1];
    }
    total += g1 - g0;
  }
  if (record) *ns = total;
}

int run(int argc, char** argv) {
  int hpg = 6, dk = 64, dv = 64, reps = 200, ctas = 0;
  std::vector<int> keys = {128, 64, 16};
  if (!parse_options(
          argc, argv, "nsa_decode_tile",
          "[--hpg 6] [--dk 64] [--dv 64] [--keys 128,64,16] [--reps 200] [--ctas N]",
          {{"--hpg", &hpg}, {"--dk", &dk}, {"--dv", &dv}, {"--reps", &reps}, {"--ctas", &ctas}},
          {{"--keys", &keys}}))
    return 2;
  using nsa::cuda::decode::kMaxHeadsPerGroup;
  using nsa::cuda::decode::kPartKeys;
  if (hpg < 1 || hpg > kMaxHeadsPerGroup || dk < 16 || dk > 256 || dk % 16 != 0 || dv < 16 ||
      dv > 256 || dv % 16 != 0 || reps < 1 || ctas < 0) {
    std::fprintf(stderr,
                 "nsa_decode_tile: --hpg must be 1..%d, --dk and --dv multiples of 16 in 16..256, "
                 "--reps positive, --ctas at least 0\n",
                 kMaxHeadsPerGroup);
    return 2;
  }
  for (const int k : keys) {
    if (k < 1 || k > kPartKeys) {
      std::fprintf(stderr, "nsa_decode_tile: --keys entries must be 1..%d, got %d\n", kPartKeys, k);
      return 2;
    }
  }
  DecodeDims m{};
  m.hpg = hpg, m.dk = dk, m.dv = dv, m.G = 1;
  m.scale = 1.0f / std::sqrt(static_cast<float>(dk));
  const size_t smem = nsa::cuda::decode::tile_bytes(dk, dv);
  NSA_CUDA_CHECK(cudaFuncSetAttribute(attend_loop, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                      static_cast<int>(smem)));
  // Random q, keys and values, uniform in [−1, 1), staged into the tile by the kernel.
  const int64_t nq = int64_t{kMaxHeadsPerGroup} * dk, nk = int64_t{kPartKeys} * dk,
                nv = int64_t{kPartKeys} * dv;
  std::mt19937 rng(1234);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  const auto upload = [&](int64_t n) {
    std::vector<__nv_bfloat16> host(static_cast<size_t>(n));
    for (auto& x : host) x = __float2bfloat16(uniform(rng));
    __nv_bfloat16* dev = nullptr;
    NSA_CUDA_CHECK(cudaMalloc(&dev, n * sizeof(__nv_bfloat16)));
    NSA_CUDA_CHECK(cudaMemcpy(dev, host.data(), n * sizeof(__nv_bfloat16), cudaMemcpyHostToDevice));
    return dev;
  };
  __nv_bfloat16 *q = upload(nq), *k = upload(nk), *v = upload(nv);
  float *ml = nullptr, *o = nullptr;
  long long* stamps = nullptr;
  unsigned long long* ns = nullptr;
  const size_t blocks = static_cast<size_t>(std::max(ctas, 1));  // each its own ml and o
  NSA_CUDA_CHECK(cudaMalloc(&ml, blocks * 2 * kMaxHeadsPerGroup * sizeof(float)));
  NSA_CUDA_CHECK(cudaMalloc(&o, blocks * kMaxHeadsPerGroup * dv * sizeof(float)));
  NSA_CUDA_CHECK(cudaMalloc(&stamps, (kPhases - 1) * reps * sizeof(long long)));
  NSA_CUDA_CHECK(cudaMalloc(&ns, sizeof(unsigned long long)));
  std::printf("tile_attend alone, one CTA of %d threads: hpg %d, dk %d, dv %d, %d calls each\n",
              nsa::cuda::decode::kPartThreads, hpg, dk, dv, reps);
  std::printf("%6s | %8s %8s %8s %8s | %8s %8s %8s | %10s\n", "keys", "median", "min", "max",
              "first", "S=QK", "soft+PV", "fold", "ns / call");
  for (const int count : keys) {
    attend_loop<<<1, nsa::cuda::decode::kPartThreads, smem>>>(m, count, reps, true, q, k, v, ml, o,
                                                              stamps, ns);
    NSA_CUDA_CHECK(cudaGetLastError());
    std::vector<long long> at((kPhases - 1) * reps);
    unsigned long long total = 0;
    NSA_CUDA_CHECK(
        cudaMemcpy(at.data(), stamps, at.size() * sizeof(long long), cudaMemcpyDeviceToHost));
    NSA_CUDA_CHECK(cudaMemcpy(&total, ns, sizeof(total), cudaMemcpyDeviceToHost));
    // Cycles of each call and of each phase, medians over the calls.
    PhaseCycles c = split_phases(at, reps, kPhases - 1);
    const long long first = c.call[0];
    std::sort(c.call.begin(), c.call.end());
    std::printf("%6d | %8lld %8lld %8lld %8lld | %8lld %8lld %8lld | %10.1f\n", count,
                median_of(c.call), c.call.front(), c.call.back(), first, median_of(c.phase[0]),
                median_of(c.phase[1]), median_of(c.phase[2]), static_cast<double>(total) / reps);
  }
  std::printf(
      "(cycles of clock64 on thread 0; phases are medians; ns / call from %%globaltimer)\n");
  if (ctas > 0) {
    // Throughput: `ctas` CTAs (as many at a time as fit an SM), each `reps` calls back to back –
    // the regime of batch 16, where thousands of parts share the SMs and every instruction counts.
    int per_sm = 0, sms = 0, dev = 0;
    NSA_CUDA_CHECK(cudaGetDevice(&dev));
    NSA_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    NSA_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(
        &per_sm, attend_loop, nsa::cuda::decode::kPartThreads, smem));
    std::printf("\nthroughput: %d CTAs (%d an SM fit, %d SMs), %d calls each\n", ctas, per_sm, sms,
                reps);
    std::printf("%6s | %12s %16s\n", "keys", "kernel ms", "ns / part (GPU)");
    cudaEvent_t t0, t1;
    NSA_CUDA_CHECK(cudaEventCreate(&t0));
    NSA_CUDA_CHECK(cudaEventCreate(&t1));
    for (const int count : keys) {
      const auto launch = [&] {
        attend_loop<<<ctas, nsa::cuda::decode::kPartThreads, smem>>>(m, count, reps, false, q, k, v,
                                                                     ml, o, stamps, ns);
      };
      launch();  // warm-up
      NSA_CUDA_CHECK(cudaEventRecord(t0));
      launch();
      NSA_CUDA_CHECK(cudaEventRecord(t1));
      NSA_CUDA_CHECK(cudaEventSynchronize(t1));
      NSA_CUDA_CHECK(cudaGetLastError());
      float ms = 0.0f;
      NSA_CUDA_CHECK(cudaEventElapsedTime(&ms, t0, t1));
      std::printf("%6d | %12.3f %16.2f\n", count, ms,
                  static_cast<double>(ms) * 1e6 / (static_cast<double>(ctas) * reps));
    }
    cudaEventDestroy(t0), cudaEventDestroy(t1);
  }
  cudaFree(q), cudaFree(k), cudaFree(v), cudaFree(ml), cudaFree(o), cudaFree(stamps), cudaFree(ns);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return guarded_main("nsa_decode_tile", run, argc, argv);
}
