// The decode selection's merge (select_blocks, src/cuda/nsa/decode_select.cuh) timed alone: one
// CTA of the picks kernel's shape, the chunks' candidate lists staged in shared memory as the
// picks kernel has them, the merge called back to back – the one-warp phase that the trace of a
// 64k, B = 1 layer showed as its largest (1.8 µs, docs/perf.md), here with nothing else on the
// GPU. Thread 0 reads clock64 before the call, at the merge's phase hooks (θ and the kept counts;
// the kept candidates placed; ranked), after its closing barrier, and after write_selection (the
// picks ascending – in the picks kernel a second warp's work while the rows come, off the way);
// each phase's median over the calls is printed, the first call apart (its code is cold). The lists
// are those of position max_len − 1 with uniform random block scores: each chunk's best n_sel − 3
// of its blocks, as block_topk leaves them; the selection is checked against the exact top-n
// computed here, so a wrong merge fails the run (exit 1). Benchmarks only.
//   nsa_decode_select [--contexts 65536,131072] [--n-sel 16] [--l-sel 64] [--reps 200]
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "cuda/common/cuda_check.h"
#include "cuda/nsa/decode_select.cuh"
#include "guarded_main.h"
#include "options.h"
#include "phase_cycles.h"

namespace {

namespace dec = nsa::cuda::decode;

// start, θ and counts, placed, ranked, the closing barrier, the selection written ascending
constexpr int kPhases = 6;

struct ClockStamps {
  long long* at;
  __device__ __forceinline__ void operator()(int phase) const {
    if (threadIdx.x == 0) at[1 + phase] = clock64();
  }
};

// `reps` merges of the same lists (staged again before each, outside the timed span). Writes each
// call's phase cycles and the last call's slot[].
__global__ void __launch_bounds__(dec::kPartThreads)
    select_loop(dec::DecodeDims m, int t, int reps, const dec::Candidate* lists, int* slot_out,
                long long* stamps) {
  extern __shared__ __align__(16) unsigned char smem[];
  __shared__ __align__(16) int picks[dec::kMaxSel];
  __shared__ int slot[dec::kMaxSel];
  __shared__ long long at[kPhases];
  const dec::SelectScratch sh = dec::carve_select(smem, m);
  const dec::SelectPlan plan = dec::select_plan(m, t);
  const int n = m.sel_chunks * dec::candidate_stride(m.n_sel);
  for (int r = 0; r < reps; ++r) {
    for (int i = threadIdx.x; i < n; i += blockDim.x) sh.cand[i] = lists[i];
    __syncthreads();
    if (threadIdx.x == 0) at[0] = clock64();
    dec::select_blocks(m, plan, sh, picks, ClockStamps{at});
    if (threadIdx.x == 0) at[4] = clock64();
    if (threadIdx.x < 32) dec::write_selection(m, plan, picks, slot);
    __syncwarp();
    if (threadIdx.x == 0) {
      at[5] = clock64();
      for (int i = 1; i < kPhases; ++i) stamps[r * (kPhases - 1) + i - 1] = at[i] - at[i - 1];
    }
    __syncthreads();
  }
  for (int i = threadIdx.x; i < m.n_sel; i += blockDim.x) slot_out[i] = slot[i];
}

uint64_t key(float score, int block) {
  uint32_t bits = 0;
  std::memcpy(&bits, &score, sizeof(bits));
  return (static_cast<uint64_t>(bits) << 32) | static_cast<uint32_t>(~static_cast<uint32_t>(block));
}

// One context: the decoder's chunking (NsaDecodeCuda's constructor), the lists, the timed merges.
int time_context(int64_t max_len, int n_sel, int l_sel, int reps, std::mt19937& rng) {
  dec::DecodeDims m{};
  m.n_sel = n_sel, m.l_sel = l_sel, m.div_lsel = nsa::FastDiv(l_sel);
  const int64_t max_candidates = std::max<int64_t>(1, (max_len - 1) / l_sel - 2);
  const int64_t span = int64_t{dec::kTopkChunk} * dec::kMaxTopkChunks;
  m.sel_chunk = static_cast<int>(dec::kTopkChunk * ((max_candidates + span - 1) / span));
  m.sel_chunks = static_cast<int>((max_candidates + m.sel_chunk - 1) / m.sel_chunk);
  const int t = static_cast<int>(max_len - 1), c = t / l_sel;
  const int forced = 1 + (c - 1 > 0) + (c > 0), free = n_sel - forced;
  const int npicks = std::max(0, std::min(c - 2, free));
  // Block scores of candidates 1 .. c − 2; each chunk's best `free`, sorted, empties after.
  std::uniform_real_distribution<float> uniform(0.0f, 1.0f);
  std::vector<uint64_t> keys;
  for (int j = 1; j <= c - 2; ++j) keys.push_back(key(uniform(rng), j));
  const int stride = dec::candidate_stride(n_sel);
  std::vector<uint64_t> lists(static_cast<size_t>(m.sel_chunks) * stride, 0);
  for (int k = 0; k < m.sel_chunks; ++k) {
    std::vector<uint64_t> chunk;
    for (int j = 1 + k * m.sel_chunk; j < std::min(1 + (k + 1) * m.sel_chunk, c - 1); ++j)
      chunk.push_back(keys[j - 1]);
    std::sort(chunk.rbegin(), chunk.rend());
    for (int i = 0; i < std::min<int>(free, static_cast<int>(chunk.size())); ++i)
      lists[static_cast<size_t>(k) * stride + i] = chunk[i];
  }
  // The exact selection: block 0, the best npicks ascending, then c − 1 and c; −1 after.
  std::sort(keys.rbegin(), keys.rend());
  std::vector<int> best;
  for (int i = 0; i < npicks; ++i)
    best.push_back(static_cast<int>(~static_cast<uint32_t>(keys[i])));
  std::sort(best.begin(), best.end());
  std::vector<int> expect = {0};
  expect.insert(expect.end(), best.begin(), best.end());
  if (c - 1 > 0) expect.push_back(c - 1);
  if (c > 0) expect.push_back(c);
  expect.resize(n_sel, -1);

  dec::Candidate* d_lists = nullptr;
  int* d_slot = nullptr;
  long long* d_stamps = nullptr;
  NSA_CUDA_CHECK(cudaMalloc(&d_lists, lists.size() * sizeof(uint64_t)));
  NSA_CUDA_CHECK(cudaMalloc(&d_slot, n_sel * sizeof(int)));
  NSA_CUDA_CHECK(
      cudaMalloc(&d_stamps, static_cast<size_t>(reps) * (kPhases - 1) * sizeof(long long)));
  NSA_CUDA_CHECK(
      cudaMemcpy(d_lists, lists.data(), lists.size() * sizeof(uint64_t), cudaMemcpyHostToDevice));
  const size_t smem = dec::select_scratch_bytes(m.sel_chunks, n_sel);
  select_loop<<<1, dec::kPartThreads, smem>>>(m, t, reps, d_lists, d_slot, d_stamps);
  NSA_CUDA_CHECK(cudaGetLastError());
  std::vector<int> slot(n_sel);
  std::vector<long long> at(static_cast<size_t>(reps) * (kPhases - 1));
  NSA_CUDA_CHECK(cudaMemcpy(slot.data(), d_slot, n_sel * sizeof(int), cudaMemcpyDeviceToHost));
  NSA_CUDA_CHECK(
      cudaMemcpy(at.data(), d_stamps, at.size() * sizeof(long long), cudaMemcpyDeviceToHost));
  cudaFree(d_lists), cudaFree(d_slot), cudaFree(d_stamps);
  const PhaseCycles cyc = split_phases(at, reps, kPhases - 1);
  std::printf("%8lld %6d %6d | %8lld %8lld | %8lld %8lld %8lld %8lld | %9lld | %s\n",
              static_cast<long long>(max_len), m.sel_chunks, npicks, median_of(cyc.call),
              cyc.call[0], median_of(cyc.phase[0]), median_of(cyc.phase[1]),
              median_of(cyc.phase[2]), median_of(cyc.phase[3]), median_of(cyc.phase[4]),
              slot == expect ? "exact" : "WRONG");
  return slot == expect ? 0 : 1;
}

int run(int argc, char** argv) {
  std::vector<int> contexts = {65536, 131072};
  int n_sel = 16, l_sel = 64, reps = 200;
  if (!parse_options(argc, argv, "nsa_decode_select",
                     "[--contexts 65536,131072] [--n-sel 16] [--l-sel 64] [--reps 200]",
                     {{"--n-sel", &n_sel}, {"--l-sel", &l_sel}, {"--reps", &reps}},
                     {{"--contexts", &contexts}}))
    return 2;
  if (n_sel < 4 || n_sel > dec::kMaxSel || l_sel < 16 || reps < 1) {
    std::fprintf(stderr,
                 "nsa_decode_select: --n-sel must be 4..%d, --l-sel at least 16, --reps "
                 "positive\n",
                 dec::kMaxSel);
    return 2;
  }
  for (const int ctx : contexts) {
    if (ctx < 4 * l_sel) {
      std::fprintf(stderr,
                   "nsa_decode_select: --contexts entries must be at least 4·l_sel, got %d\n", ctx);
      return 2;
    }
  }
  std::printf(
      "select_blocks alone, one CTA of %d threads: n_sel %d, l_sel %d, %d calls each, "
      "position max_len − 1, uniform random block scores\n",
      dec::kPartThreads, n_sel, l_sel, reps);
  std::printf("%8s %6s %6s | %8s %8s | %8s %8s %8s %8s | %9s | %s\n", "max_len", "lists", "picks",
              "median", "first", "θ+count", "placed", "ranked", "barrier", "ascending",
              "selection");
  std::mt19937 rng(1234);
  int bad = 0;
  for (const int ctx : contexts) bad += time_context(ctx, n_sel, l_sel, reps, rng);
  std::printf(
      "(cycles of clock64 on thread 0, medians over the calls, 'ascending' included; 'barrier' "
      "ends after the merge's closing barrier)\n");
  return bad == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  return guarded_main("nsa_decode_select", run, argc, argv);
}
