// NSA attention for one new token per sequence, with caches on the GPU (docs/inference.md,
// "Decoding on the GPU"; the CPU twin is src/decode/nsa_decode_cache.h): a batch of B independent
// sequences, each at its own position.
//
// Caches (bf16, per sequence): raw K/V of the selected branch for every position, a ring of the
// last w raw K/V for the window, a ring of the last l raw K/V of the compressed branch, and the
// compressed K/V – one token emitted every d steps once l are available (φ = avg). Each is
// [B, G, rows, dk|dv]: a group's rows contiguous, so that a part's rows are one block of memory
// (docs/inference.md). Dense decoding (the baseline of `nsa bench decode`) keeps only the first
// cache and attends over all of it.
//
// A step is three kernels (dense: two), all reading the positions from device memory (nothing on
// the host depends on them, so a step can be captured in a CUDA graph and replayed), each taking
// the one parameter struct DecodeParams (decode_params.cuh) and launched as a programmatic
// dependent launch; the work of one (sequence, group) is split over many CTAs ("parts" of up to
// 128 keys, the group's heads as the rows of tensor-core tiles):
//   parts   the parts whose rows do not depend on the position, loaded before it is read:
//           compressed parts (scores kept), window ring slots, the forced block 0 (dense: parts
//           over the whole cache); the token's own row comes from the inputs, the compressed
//           token completing at t is averaged by the CTA that attends it, part 0 appends the
//           token's K/V to the caches;
//   top-n   block scores (docs/nsa.md) over chunks of blocks, each chunk's best n_sel − forced;
//           per head, the parts above merged into one partial per branch;
//   picks   one cluster of CTAs per (sequence, group): each CTA ranks the chunks' candidates
//           into the exact top-n and attends its share of the forced blocks c − 1, c and of the
//           picked blocks, keeping the partial in its shared memory; after the cluster's barrier
//           each gates its share of the heads – the pre-merged partials and every CTA's, read
//           across the cluster – into o [B, H·dv] (dense: a combine kernel).
#pragma once

#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <vector>

#include "common/device_buffer.h"
#include "nsa/attention.h"
#include "nsa/error.h"

namespace nsa::cuda {

// The parts kernel's cache rows by the copy engine (TMA) instead of cp.async, where that wins
// (d_k = d_v = 64, G ≥ 2; nsa_decode.cu): on, and the maps of
// the compressed, window and selected caches' key rows (swizzled) and value rows (padded) – the
// kernel's parameter, as NsaDecodeCuda keeps it and passes it every step.
struct DecodePartMaps {
  CUtensorMap k[3], v[3];  // compressed, window, selected caches
  int on;
};

// The picks kernel's selected blocks by TMA where it pays (d_k = d_v = 64, G ≥ 2, l_sel = 64;
// nsa_decode.cu): on, and the selected caches' maps of l_sel-row boxes (keys
// swizzled, values padded) – the kernel's parameter, as DecodePartMaps.
struct DecodePickMaps {
  CUtensorMap k, v;
  int on;
};

class NsaDecodeCuda {
 public:
  // dense: the baseline (full causal attention over the selected branch's K/V, no gates).
  NsaDecodeCuda(const NsaConfig& cfg, int64_t batch, int64_t max_len, bool dense);

  // One token per sequence at positions pos[b] (device, [B]): q [B, H, dk], k/v per branch
  // [B, G, dk] / [B, G, dv] (kv = shared: index 0), gates per branch [B, H]; o [B, H·dv].
  void step(const __nv_bfloat16* q, const __nv_bfloat16* const k[kNumBranches],
            const __nv_bfloat16* const v[kNumBranches],
            const __nv_bfloat16* const gate[kNumBranches], const int32_t* pos, __nv_bfloat16* o,
            cudaStream_t stream);

  // For benchmarks: every sequence holds `len` tokens of random K/V (compressed tokens included).
  void fill_random(int64_t len, uint64_t seed, cudaStream_t stream);

  // Batched prefill (decode_prefill.cu): fills sequences seqs[i] (device, [n]) from one packed
  // forward's rotated K/V per branch (k / v [T, G, dk|dv] bf16; kv = shared: index 0), prompt i at
  // rows cu_seqlens[i] .. cu_seqlens[i + 1] (device, [n + 1]), the longest max_prompt tokens: the
  // state the prompts' append steps leave, compressed tokens averaged as append does, bit for bit.
  // The positions are the caller's (each becomes its prompt's length).
  void prefill(const __nv_bfloat16* const k[kNumBranches],
               const __nv_bfloat16* const v[kNumBranches], const int64_t* cu_seqlens,
               const int32_t* seqs, int64_t n, int64_t max_prompt, cudaStream_t stream);
  // Copies the caches of sequence `from`, holding `len` tokens, to sequence `to` (identical
  // prompts are prefilled once).
  void copy_sequence(int64_t from, int64_t to, int64_t len, cudaStream_t stream);

  // The last step's selected blocks [B, G, n_sel] (ascending, −1 padded; NSA only).
  const int32_t* selection() const { return sel_.get(); }
  // K/V bytes a step at position t reads per sequence: the paper's access model, exact for bf16
  // caches (compressed + selected + window tokens, or t + 1 for dense).
  int64_t kv_bytes_per_step(int64_t t) const;
  // Cache bytes held on the device.
  size_t bytes() const;
  // Whether the parts' and the picks' cache rows come as TMA boxes (the constructor's choice from
  // the shape and the grids' sizes against the SMs) – for tests that must cover both paths.
  bool parts_rows_by_tma() const { return part_maps_.on != 0; }
  bool picks_rows_by_tma() const { return pick_maps_.on != 0; }
  // Whether the compressed parts leave the top-n block sums instead of every score (the
  // constructor's choice from the shape: decode_params.cuh, "The block sums").
  bool selection_by_block_sums() const { return sums_q_ > 0; }
  int64_t topk_chunk() const { return sel_chunk_; }            // candidate blocks a top-n chunk
  bool picks_spread() const { return picks_smem_floor_ > 0; }  // at most two picks CTAs an SM
  // Parts CTAs an SM can hold at once (the occupancy query on the untraced kernel with its shared
  // memory): six for m7c's tile (its launch bounds), which a larger tile silently lowers.
  int parts_ctas_per_sm() const;
  // The constructor's choices in one line, for benchmarks' tables and logs: each kernel's grid
  // (CTAs) and the paths above, e.g. m7c at 64k, B = 16: "parts 1184 TMA, 6 an SM | top-n 704,
  // chunks of 64, block sums | picks 256 in clusters of 8, TMA" (dense: the parts and the combine).
  std::string plan() const;

  // Phase timestamps (decode_trace.cuh; `nsa bench decode --trace`): steps launched or captured
  // on `stream` after this call have every CTA of the three kernels stamp %globaltimer at fixed
  // points (the buffer is cleared on `stream`). Step call i writes slot i mod `calls`, so that the
  // n_layers steps captured in one graph keep a slot each.
  static constexpr int kTraceKernels = 3, kTracePhases = 8;
  void enable_trace(cudaStream_t stream, int64_t calls = 1);
  struct Trace {
    int64_t ctas[kTraceKernels] = {};  // CTAs of parts, top-n, picks
    int64_t stride = 0;                // CTAs per kernel in t
    int64_t calls = 1;                 // slots: step calls
    // [call, kernel, CTA, phase] ns; 0: the CTA did not get there
    std::vector<uint64_t> t;
    // The place of (call, kernel, CTA, phase) in t.
    size_t index(int64_t call, int kernel, int64_t cta, int phase) const {
      return static_cast<size_t>(((call * kTraceKernels + kernel) * stride + cta) * kTracePhases +
                                 phase);
    }
    // Appends `next`'s calls after this trace's (another decoder of the same shape: a model's
    // layers, one decoder each); an empty trace takes `next` as it is.
    void append(const Trace& next) {
      if (t.empty()) {
        *this = next;
        return;
      }
      NSA_CHECK(next.stride == stride && next.ctas[0] == ctas[0] && next.ctas[1] == ctas[1] &&
                    next.ctas[2] == ctas[2],
                "decode trace: appending a trace of another shape");
      t.insert(t.end(), next.t.begin(), next.t.end());
      calls += next.calls;
    }
  };
  Trace trace() const;  // waits for the device
  // The name of a kernel's phase, or nullptr where the kernel has none.
  static const char* trace_phase(int kernel, int phase);
  static const char* trace_kernel(int kernel);

 private:
  size_t block_topk_smem_bytes() const;
  size_t parts_smem_bytes() const;
  size_t picks_smem_bytes() const;
  void spread_picks();
  int64_t kernel_ctas(int kernel) const;  // grid size of parts / top-n / picks (TraceKernel order)
  NsaConfig cfg_;
  int64_t B_, max_len_, max_cmp_, sel_chunk_ = 1, sel_chunks_ = 1;
  // Parts per (sequence, group) of each kind and the slots of their partials (decode_params.cuh).
  int64_t cmp_parts_ = 0, win_parts_ = 0, block0_parts_ = 0, late_parts_ = 0, pick_parts_ = 0;
  int64_t dense_parts_ = 0, slots_ = 0;
  int64_t sums_q_ = 0;          // the block sums' quartets per row (0: every compressed score kept)
  unsigned picks_cluster_ = 1;  // CTAs of the picks kernel per (sequence, group)
  size_t picks_smem_floor_ = 0;  // the picks' shared memory at least (constructor: their spread)
  // The parts kernel's cache rows by TMA where it wins (DecodePartMaps; constructor).
  DecodePartMaps part_maps_{};
  DecodePickMaps pick_maps_{};  // the picks' rows by TMA where it wins (constructor)
  bool warm_picks_ = false;     // the picks' dry selection before their wait (constructor)
  bool dense_;
  DeviceBuffer<__nv_bfloat16> k_sel_, v_sel_, k_win_, v_win_, k_raw_, v_raw_, k_cmp_, v_cmp_;
  DeviceBuffer<float> scores_, part_ml_, part_o_;
  DeviceBuffer<uint64_t> candidates_;  // [B, G, sel_chunks, candidate_stride(n_sel)] keys
  DeviceBuffer<int32_t> sel_;
  DeviceBuffer<uint64_t> trace_;  // empty: no trace
  int64_t trace_ctas_ = 0, trace_calls_ = 1, trace_next_ = 0;
};

// pos[b] += 1 for b < batch: the end of a step, on the device (so a captured step replays).
void launch_advance_positions(int32_t* pos, int64_t batch, cudaStream_t stream);

// For benchmarks: x[i] uniform in [−half_range, half_range), a hash of (seed, i) – reproducible.
void launch_fill_uniform(__nv_bfloat16* x, int64_t n, uint64_t seed, float half_range,
                         cudaStream_t stream);

}  // namespace nsa::cuda
