// How long a decode part takes to bring its cache rows into shared memory – the parts kernel's
// load, timed alone (docs/perf.md, twenty-seventh session). The step's trace showed the parts'
// "cache rows issued" mark 2.6–3.6 µs after the CTA started: issuing 16 cp.async of 16 bytes a
// thread should take a fraction of that, unless each SM can keep only so many bytes in flight.
// This program times N CTAs (one part each: 128 key rows and 128 value rows of 128 bytes, a group's
// rows 256 bytes apart as m7c's caches were until the thirty-ninth session, or G·128 with --groups
// G; --groups 1 is the group-major caches' contiguous rows) loading rows from memory that is
// not in L2, two ways:
//   cp.async   every thread 16-byte copies, as tile_issue_rows (decode_tile.cuh) does;
//   tma        one thread, two tensor-map boxes (common/tma.h: 64 columns × 128 rows, the 128-byte
//              swizzle – for d_k = 64 the same order as the tile's key_piece), one mbarrier.
// Thread 0 of each CTA reads %globaltimer at its start, after the copies are issued and once they
// have landed; per launch the median and the last CTA, then the median over launches. Each launch
// reads rows no launch before it touched for a while (a 1 GiB window walked in order), so the
// bytes come from HBM as a decode step's do. Benchmarks only. What it showed (H200): TMA issues in
// 0.2 µs what cp.async issues in 0.9–1.8, lands 74 CTAs' rows about as fast, and falls behind past
// a CTA an SM at this row stride – the parts kernel's first rule (nsa_decode.cu, DecodePartMaps;
// measured in the step since, it takes TMA up to four CTAs an SM).
//   nsa_decode_loads [--ctas 1,74,148,264] [--reps 40] [--groups 2]
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "cuda/common/cuda_check.h"
#include "cuda/common/tma.cuh"
#include "cuda/common/tma.h"
#include "cuda/nsa/decode_tile.cuh"
#include "guarded_main.h"
#include "options.h"

namespace {

using bf16 = __nv_bfloat16;
using nsa::cuda::decode::DecodeDims;
using nsa::cuda::decode::kPartKeys;
using nsa::cuda::decode::Tile;

constexpr int kDim = 64;
constexpr int kStamps = 3;  // start, issued, landed

__device__ __forceinline__ unsigned long long now() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// CTA i copies rows first + i·kPartKeys .. + kPartKeys − 1 of group 0.
template <bool kTma>
__global__ void __launch_bounds__(nsa::cuda::decode::kPartThreads)
    load_rows(const bf16* k, const bf16* v, const __grid_constant__ CUtensorMap k_map,
              const __grid_constant__ CUtensorMap v_map, int groups, int64_t first,
              unsigned long long* stamps) {
  extern __shared__ __align__(1024) unsigned char smem[];
  __shared__ uint64_t bar;
  const unsigned long long t0 = now();
  const int64_t row0 = first + static_cast<int64_t>(blockIdx.x) * kPartKeys;
  unsigned long long t1;
  if constexpr (kTma) {
    if (threadIdx.x == 0) {
      nsa::cuda::mbarrier_init_one(&bar);
      nsa::cuda::mbarrier_init_fence();
      nsa::cuda::mbarrier_expect_bytes(&bar, 2 * kPartKeys * kDim * sizeof(bf16));
      nsa::cuda::tma_load_box(smem, &k_map, 0, 0, static_cast<int32_t>(row0), &bar);
      nsa::cuda::tma_load_box(smem + kPartKeys * kDim * sizeof(bf16), &v_map, 0, 0,
                              static_cast<int32_t>(row0), &bar);
    }
    t1 = now();
    __syncthreads();  // the barrier's initialisation is visible
    nsa::cuda::mbarrier_wait(&bar, 0);
  } else {
    DecodeDims m{};
    m.dk = kDim, m.dv = kDim, m.G = groups;
    const Tile tl = nsa::cuda::decode::carve_tile(smem, kDim, kDim);
    const int64_t stride = int64_t{groups} * kDim;
    nsa::cuda::decode::tile_issue_rows(m, tl, kPartKeys, k + row0 * stride, v + row0 * stride,
                                       stride, stride);
    nsa::cuda::cp_async_commit();
    t1 = now();
    nsa::cuda::cp_async_wait<0>();
    __syncthreads();
  }
  const unsigned long long t2 = now();
  if (threadIdx.x == 0) {
    unsigned long long* s = stamps + static_cast<int64_t>(blockIdx.x) * kStamps;
    s[0] = t0, s[1] = t1, s[2] = t2;
  }
}

double median(std::vector<double> x) {
  std::sort(x.begin(), x.end());
  return x.empty() ? 0.0 : x[x.size() / 2];
}

int run(int argc, char** argv) {
  std::vector<int> ctas_list = {1, 74, 148, 264};
  int reps = 40, groups = 2;
  if (!parse_options(argc, argv, "nsa_decode_loads",
                     "[--ctas 1,74,148,264] [--reps 40] [--groups 2]",
                     {{"--reps", &reps}, {"--groups", &groups}}, {{"--ctas", &ctas_list}}))
    return 2;
  const int max_ctas = *std::max_element(ctas_list.begin(), ctas_list.end());
  if (reps < 2 || max_ctas < 1 || max_ctas > 4096 || groups < 1 || groups > 8) {
    std::fprintf(stderr,
                 "nsa_decode_loads: --reps at least 2, --ctas entries 1..4096, --groups 1..8\n");
    return 2;
  }
  // 512 MiB each for K and V: rows [R, G, 64] bf16.
  const int64_t rows = (int64_t{512} << 20) / (groups * kDim * sizeof(bf16));
  bf16 *k = nullptr, *v = nullptr;
  NSA_CUDA_CHECK(cudaMalloc(&k, rows * groups * kDim * sizeof(bf16)));
  NSA_CUDA_CHECK(cudaMalloc(&v, rows * groups * kDim * sizeof(bf16)));
  NSA_CUDA_CHECK(cudaMemset(k, 0, rows * groups * kDim * sizeof(bf16)));
  NSA_CUDA_CHECK(cudaMemset(v, 0, rows * groups * kDim * sizeof(bf16)));
  const CUtensorMap k_map = nsa::cuda::make_group_rows_map(k, rows, groups, kDim, kPartKeys);
  const CUtensorMap v_map = nsa::cuda::make_group_rows_map(v, rows, groups, kDim, kPartKeys);
  unsigned long long* stamps = nullptr;
  NSA_CUDA_CHECK(cudaMalloc(&stamps, size_t{4096} * kStamps * sizeof(unsigned long long)));
  const size_t smem = 1024 + nsa::cuda::decode::tile_bytes(kDim, kDim);
  NSA_CUDA_CHECK(cudaFuncSetAttribute(load_rows<false>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                      static_cast<int>(smem)));
  NSA_CUDA_CHECK(cudaFuncSetAttribute(load_rows<true>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                      static_cast<int>(smem)));
  std::printf(
      "a part's cache rows (128 K + 128 V rows of 128 B, %d B apart: 32 KiB) from HBM into shared "
      "memory, "
      "N CTAs at once; µs from the CTA's start, median of %d launches (each the median / last "
      "CTA)\n",
      groups * 128, reps);
  std::printf("%8s %6s | %8s %8s | %8s %8s | %10s\n", "way", "CTAs", "issued", "last", "landed",
              "last", "GB/s (all)");
  int64_t first = 0;
  for (const int ctas : ctas_list) {
    for (const bool tma : {false, true}) {
      std::vector<double> issued, issued_last, landed, landed_last, rate;
      for (int r = 0; r <= reps; ++r) {
        if (first + int64_t{ctas} * kPartKeys > rows) first = 0;
        (tma ? load_rows<true> : load_rows<false>)<<<ctas, nsa::cuda::decode::kPartThreads, smem>>>(
            k, v, k_map, v_map, groups, first, stamps);
        NSA_CUDA_CHECK(cudaGetLastError());
        first += int64_t{ctas} * kPartKeys;
        std::vector<unsigned long long> s(static_cast<size_t>(ctas) * kStamps);
        NSA_CUDA_CHECK(
            cudaMemcpy(s.data(), stamps, s.size() * sizeof(s[0]), cudaMemcpyDeviceToHost));
        if (r == 0) continue;  // cold code
        unsigned long long start = s[0], end = 0;
        std::vector<double> a, b;
        for (int c = 0; c < ctas; ++c) {
          start = std::min(start, s[c * kStamps]);
          end = std::max(end, s[c * kStamps + 2]);
          a.push_back((s[c * kStamps + 1] - s[c * kStamps]) * 1e-3);
          b.push_back((s[c * kStamps + 2] - s[c * kStamps]) * 1e-3);
        }
        issued.push_back(median(a));
        issued_last.push_back(*std::max_element(a.begin(), a.end()));
        landed.push_back(median(b));
        landed_last.push_back(*std::max_element(b.begin(), b.end()));
        rate.push_back(ctas * 32768.0 / std::max<double>(1.0, static_cast<double>(end - start)));
      }
      std::printf("%8s %6d | %8.2f %8.2f | %8.2f %8.2f | %10.1f\n", tma ? "tma" : "cp.async", ctas,
                  median(issued), median(issued_last), median(landed), median(landed_last),
                  median(rate));
    }
  }
  NSA_CUDA_CHECK(cudaFree(stamps));
  NSA_CUDA_CHECK(cudaFree(k));
  NSA_CUDA_CHECK(cudaFree(v));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return guarded_main("nsa_decode_loads", run, argc, argv);
}
