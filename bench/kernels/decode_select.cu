// The decode selection's merge (select_blocks, src/cuda/nsa/decode_select.cuh) timed alone: one
// CTA of the picks kernel's shape, the chunks' candidate lists staged in shared memory as the
// picks kernel has them, the merge called back to back – the one-warp phase that the trace of a
// 64k, B = 1 layer showed as its largest (1.8 µs, docs/perf.md), here with nothing else on the
// GPU. Thread 0 reads clock64 before the call, at the merge's phase hooks (θ and the kept counts;
// the kept candidates placed; ranked), after its closing barrier, and after write_selection (the
// picks ascending – in the picks kernel a second warp's work while the rows come, off the way);
// each phase's median over the calls is printed, the first call apart (its code is cold). The lists
// are those of position max_len − 1 with uniform random block scores: each chunk's best n_sel − 3
// of its blocks, as block_topk leaves them; the selection is checked against the CPU reference's
// (cpu::select_blocks), so a wrong merge fails the run (exit 1). Benchmarks only.
//   nsa_decode_select [--contexts 65536,131072] [--n-sel 16] [--l-sel 64] [--reps 200]
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "cpu/block_select.h"
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
  const int n = static_cast<int>(dec::candidate_keys(m.sel_chunks, m.n_sel));
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

// One context: the decoder's chunking (topk_chunks), each chunk's list, the timed merges; the
// expected selection from the CPU reference (cpu::select_blocks).
int time_context(int64_t max_len, int n_sel, int l_sel, int reps, std::mt19937& rng) {
  dec::DecodeDims m{};
  m.n_sel = n_sel, m.l_sel = l_sel, m.div_lsel = nsa::FastDiv(l_sel);
  const dec::TopkChunks chunking = dec::topk_chunks(max_len, l_sel);
  m.sel_chunk = static_cast<int>(chunking.chunk);
  m.sel_chunks = static_cast<int>(chunking.chunks);
  const int t = static_cast<int>(max_len - 1), c = t / l_sel;
  // Block scores of candidates 1 .. c − 2 (the forced blocks' do not count), the selection, and
  // each chunk's best n_sel − forced, sorted, empties after, as block_topk leaves them.
  std::uniform_real_distribution<float> uniform(0.0f, 1.0f);
  std::vector<float> scores(static_cast<size_t>(c) + 1, 0.0f);
  for (int j = 1; j <= c - 2; ++j) scores[j] = uniform(rng);
  std::vector<int> expect(n_sel);
  const int chosen =
      static_cast<int>(nsa::cpu::select_blocks(scores.data(), t, l_sel, n_sel, expect.data()));
  const int npicks = static_cast<int>(
      std::count_if(expect.begin(), expect.end(), [c](int v) { return v > 0 && v < c - 1; }));
  const int free = n_sel - (chosen - npicks);
  const int stride = dec::candidate_stride(n_sel);
  std::vector<uint64_t> lists(static_cast<size_t>(dec::candidate_keys(m.sel_chunks, n_sel)), 0);
  for (int k = 0; k < m.sel_chunks; ++k) {
    std::vector<uint64_t> chunk;
    for (int j = 1 + k * m.sel_chunk; j < std::min(1 + (k + 1) * m.sel_chunk, c - 1); ++j)
      chunk.push_back(key(scores[j], j));
    std::sort(chunk.rbegin(), chunk.rend());
    for (int i = 0; i < std::min<int>(free, static_cast<int>(chunk.size())); ++i)
      lists[static_cast<size_t>(k) * stride + i] = chunk[i];
  }

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
  if (n_sel < 4 || n_sel > dec::kMaxSel - 3 || l_sel < 16 || reps < 1) {  // the decoder's limit
    std::fprintf(stderr,
                 "nsa_decode_select: --n-sel must be 4..%d, --l-sel at least 16, --reps "
                 "positive\n",
                 dec::kMaxSel - 3);
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
