// NSA decode kernels: parts, block top-n, picks (dense: parts, combine) – see nsa_decode.h and
// docs/inference.md. Decoding reads little per step (tens of KB to a few MB per layer), so it is
// latency-bound: few dependent kernels, each split into many small CTAs over the keys of every
// (sequence, group), each CTA issuing all its loads before waiting for any, tensor cores for the
// products, partial softmax results merged in a fixed order (no float atomics: bit-identical runs,
// whatever else is in the batch).
#include "nsa_decode.h"

#include <algorithm>

#include "common/dependent_launch.cuh"
#include "common/dynamic_smem.h"
#include "common/tma.cuh"
#include "common/tma.h"
#include "decode_merge.cuh"
#include "decode_params.cuh"
#include "decode_select.cuh"
#include "decode_tile.cuh"
#include "decode_trace.cuh"
#include "device.h"
#include "nsa/error.h"

namespace nsa::cuda {
namespace {

using namespace decode;

// Writes the token's K/V at position t: the selected branch's row t (and dense decoding's), the
// window ring's slot t mod w, the compressed branch's raw ring slot t mod l. No CTA of the step
// reads those rows from the caches: readers of position t take it from the inputs, and the
// compressed token that completes at t (compress_row) reads the ring's other l − 1 slots.
__device__ void append_rows(const DecodeParams& p, int b, int g, int t) {
  const DecodeDims& m = p.dims;
  const int nk = m.dk / 8, nv = m.dv / 8, per = nk + nv, rows = p.dense ? 1 : 3;
  const int64_t in_k = (static_cast<int64_t>(b) * m.G + g) * m.dk;
  const int64_t in_v = (static_cast<int64_t>(b) * m.G + g) * m.dv;
  for (int i = threadIdx.x; i < rows * per; i += blockDim.x) {
    const int which = i / per, j = i % per;
    const bool is_k = j < nk;
    const int piece = is_k ? j : j - nk, dim = is_k ? m.dk : m.dv;
    const int br = which == 0 ? kSel : which == 1 ? kWin : kCmp;
    const bf16* src = (is_k ? p.k_in[br] : p.v_in[br]) + (is_k ? in_k : in_v);
    bf16* dst = which == 0   ? row(is_k ? p.k_sel : p.v_sel, b, m.max_len, t, g, m, dim)
                : which == 1 ? row(is_k ? p.k_win : p.v_win, b, m.w, m.div_w.mod(t), g, m, dim)
                             : row(is_k ? p.k_raw : p.v_raw, b, m.l, m.div_l.mod(t), g, m, dim);
    reinterpret_cast<uint4*>(dst)[piece] = reinterpret_cast<const uint4*>(src)[piece];
  }
}

// Compressed token e, which completes at position t (φ = avg over positions t − l + 1 .. t, oldest
// first, fp32 sum × 1/l rounded to bf16 – decode_prefill.cu's arithmetic, bit for bit), into the
// tile's key and value rows `c` and the compressed cache. Position t comes from the inputs.
__device__ void compress_row(const DecodeParams& p, int b, int g, int t, int e, const Tile& tl,
                             int c) {
  const DecodeDims& m = p.dims;
  const float inv_l = 1.0f / static_cast<float>(m.l);
  for (int i = threadIdx.x; i < m.dk + m.dv; i += blockDim.x) {
    const bool is_k = i < m.dk;
    const int el = is_k ? i : i - m.dk, dim = is_k ? m.dk : m.dv;
    const bf16* ring = is_k ? p.k_raw : p.v_raw;
    const bf16 latest =
        (is_k ? p.k_in[kCmp] : p.v_in[kCmp])[(static_cast<int64_t>(b) * m.G + g) * dim + el];
    float s = 0.0f;
    for (int r = 0; r < m.l; ++r) {
      const int pos = t - m.l + 1 + r;
      s += __bfloat162float(pos == t ? latest : row(ring, b, m.l, m.div_l.mod(pos), g, m, dim)[el]);
    }
    const bf16 y = __float2bfloat16(s * inv_l);
    (is_k ? key_at(tl, c, el / 8) + el % 8 : tl.v + c * tl.vs + el)[0] = y;
    row(is_k ? p.k_cmp : p.v_cmp, b, m.max_cmp, e, g, m, dim)[el] = y;
  }
}

// The token's rows of a branch: position t comes from the step's inputs.
struct InputRows {
  const bf16 *k, *v;
};

__device__ __forceinline__ InputRows input_rows(const DecodeParams& p, int br, int b, int g) {
  const DecodeDims& m = p.dims;
  const int64_t r = static_cast<int64_t>(b) * m.G + g;
  return InputRows{p.k_in[br] + r * m.dk, p.v_in[br] + r * m.dv};
}

enum class PartKind { kCompressed, kWindow, kBlock0, kDense };

// Part y of a (sequence, group): its kind, the cache rows it reads – up to `avail` rows from row
// `first` on, of a cache of `rows` rows a sequence – and its partial's slot (decode_params.cuh).
struct PartRange {
  PartKind kind;
  int first, slot, avail;
  int64_t rows;
};

__device__ __forceinline__ PartRange part_range(const DecodeDims& m, bool dense, int y) {
  PartRange r{PartKind::kCompressed, y * kPartKeys, y, 0, m.max_cmp};
  if (dense) {
    r.kind = PartKind::kDense, r.rows = m.max_len;
  } else if (const int k = y - m.cmp_parts; k >= 0 && k < m.win_parts) {
    r.kind = PartKind::kWindow, r.first = k * kPartKeys, r.slot = m.slot_win + k, r.rows = m.w;
  } else if (k >= m.win_parts) {
    r.kind = PartKind::kBlock0, r.first = (k - m.win_parts) * m.seg_len;
    r.slot = m.slot_block0 + k - m.win_parts, r.rows = m.max_len;
  }
  r.avail = static_cast<int>(min(
      static_cast<int64_t>(r.kind == PartKind::kBlock0 ? m.seg_len : kPartKeys), r.rows - r.first));
  if (r.kind == PartKind::kBlock0) r.avail = min(r.avail, m.l_sel - r.first);
  return r;
}

// A kind's caches: its key and value rows and the part maps' index of them
// (NsaDecodeCuda::part_maps_: compressed, window, selected – the dense parts and block 0 read the
// selected cache).
struct PartCaches {
  const bf16 *k, *v;
  int map;
};

__device__ __forceinline__ PartCaches part_caches(const DecodeParams& p, PartKind kind) {
  if (kind == PartKind::kCompressed) return PartCaches{p.k_cmp, p.v_cmp, 0};
  if (kind == PartKind::kWindow) return PartCaches{p.k_win, p.v_win, 1};
  return PartCaches{p.k_sel, p.v_sel, 2};
}

// Grid (B·G, parts): the parts whose rows do not depend on the position – NSA: compressed parts
// [0, cmp_parts), window parts (ring slots), the forced block 0 (decode_params.cuh's slots); dense:
// parts over positions k·kPartKeys .. – so each CTA issues its loads, then reads the position: one
// round trip. Then the rows past the position are cut off, the token's own row (position t, not
// in the caches yet) is put in from the inputs, and a compressed token that completes at t is
// averaged here. The CTA of part 0 also appends the token's K/V. Six CTAs a multiprocessor (the
// tile's shared memory allows six; the bound keeps the registers at ≤ 80, without spills).
// With maps.on, the copy engine brings the part's cache rows (NsaDecodeCuda::part_maps_): one
// thread issues two boxes of 128 rows – keys (64 columns, swizzled) and values (72 columns: the
// padded rows, zeros past the last group) of group g – at row b·rows + first of the cache's map,
// which frees the other threads at once; the trace put 2.3 µs of a 64k, B = 1 layer (3.6 in the
// model's step) on issuing the same rows as 16-byte cp.async (docs/perf.md). Rows past the part's
// count are junk or zeros, fixed as cp.async's stale rows are (tile_fix_rows).
template <bool kTrace>
__global__ void __launch_bounds__(kPartThreads, 6)
    parts_kernel(const DecodeParams p, const __grid_constant__ DecodePartMaps maps) {
  const DecodeDims& m = p.dims;
  extern __shared__ __align__(16) unsigned char smem[];
  __shared__ uint64_t rows_landed;        // maps.on: the boxes' barrier
  trace_mark<kTrace>(p, kTraceParts, 0);  // start
  const int bg = blockIdx.x, b = m.div_g.div(bg), g = bg - b * m.G, y = blockIdx.y;
  const Tile tl = maps.on ? carve_tile_aligned64(smem) : carve_tile(smem, m.dk, m.dv);
  const PartRange pr = part_range(m, p.dense, y);
  const PartKind kind = pr.kind;
  const int first = pr.first, slot = pr.slot, avail = pr.avail;
  const int64_t rows = pr.rows;
  const PartCaches caches = part_caches(p, kind);
  // The cache rows are copied before the wait: the rows this step writes (position t, the
  // compressed token completing at t) are replaced from the inputs below, and the others were
  // written by earlier steps, many kernels back (common/dependent_launch.cuh).
  trace_mark<kTrace>(p, kTraceParts, 5);  // rows addressed: the part's kind and range known
  if (maps.on) {
    if (threadIdx.x == 0) {
      const int which = caches.map;
      const int32_t at = static_cast<int32_t>(cache_row(b, g, m.G, rows, first));
      mbarrier_init_one(&rows_landed);
      mbarrier_init_fence();
      mbarrier_expect_bytes(&rows_landed, row_boxes_bytes(kPartKeys));
      tile_issue_row_boxes(tl, 0, &maps.k[which], &maps.v[which], at, &rows_landed);
    }
    __syncthreads();  // the barrier is initialised before any thread waits on it
  } else {
    tile_issue_rows(m, tl, avail, row(caches.k, b, rows, first, g, m, m.dk),
                    row(caches.v, b, rows, first, g, m, m.dv), m.dk, m.dv);
  }
  trace_mark<kTrace>(p, kTraceParts, 1);  // cache rows issued
  wait_for_previous_kernel();
  trace_mark<kTrace>(p, kTraceParts, 2);  // released: the previous kernel is done
  tile_issue_q(m, p.q, b, g, tl);
  cp_async_commit();
  const int br = kind == PartKind::kWindow ? kWin : kind == PartKind::kCompressed ? kCmp : kSel;
  const int64_t in_row = static_cast<int64_t>(b) * m.G + g;
  const uint4 piece = load_input_piece(m, p.k_in[br] + in_row * m.dk, p.v_in[br] + in_row * m.dv);
  const int t = p.pos[b];
  if (y == 0) append_rows(p, b, g, t);
  // Keys count of the part, the row of position t (−1: none), the compressed token averaged here.
  int count, patch = -1, emit = -1;
  if (kind == PartKind::kCompressed) {
    const int n = num_cmp(m, t);
    count = max(0, min(avail, n - first));
    if (n > 0 && m.div_d.mod(t + 1 - m.l) == 0 && n - 1 >= first && n - 1 < first + count)
      emit = n - 1 - first;
  } else {
    // Window: slots 0 .. min(w, t + 1) − 1 hold positions t − w + 1 .. t (slot = position mod
    // w); the others: rows are positions.
    const int valid = kind == PartKind::kWindow ? min(m.w, t + 1) : t + 1;
    count = max(0, min(avail, valid - first));
    const int at = (kind == PartKind::kWindow ? m.div_w.mod(t) : t) - first;
    patch = at >= 0 && at < count ? at : -1;
  }
  float* ml = p.part_ml + 2 * part_index(m, bg, slot);
  cp_async_wait<0>();  // (also before an exit: the copies land before shared memory is released)
  if (maps.on) mbarrier_wait(&rows_landed, 0);
  if (count == 0) {
    // Compressed and dense parts past the last key are not read (their merges stop at the last
    // part); window and block-0 slots are always merged, so they say "empty".
    if (kind == PartKind::kWindow || kind == PartKind::kBlock0) write_empty(m, ml);
    return;
  }
  __syncthreads();                        // every copy has landed
  trace_mark<kTrace>(p, kTraceParts, 3);  // landed
  tile_fix_rows(m, tl, count, patch, piece);
  if (emit >= 0) compress_row(p, b, g, t, first + emit, tl, emit);
  __syncthreads();
  // What a compressed part leaves the top-n: block sums or every score.
  const bool cmp = kind == PartKind::kCompressed;
  const ScoresOut out{
      cmp && m.sums_q == 0 ? p.scores + static_cast<int64_t>(bg) * m.hpg * m.max_cmp + first
                           : nullptr,
      m.max_cmp, cmp && m.sums_q > 0 ? block_sums_row(m, p.scores, bg, 0) : nullptr, first};
  tile_attend_part<true>(m, tl, count, out, ml, p.part_o + part_index(m, bg, slot) * m.dv);
  trace_mark<kTrace>(p, kTraceParts, 4);  // attended
}

// Grid (B·G, sel_chunks + hpg): CTAs below sel_chunks score a chunk of blocks and keep its
// candidates (decode_select.cuh); the others each merge one head's parts of the earlier kernel –
// every compressed part, the window's, block 0's – into a partial per branch (slot slot_pre + r),
// while the chunks rank, so that the picks kernel's final merge reads one partial a branch.
static_assert(kTopkThreads / 4 >= 256 / 4,
              "a pre-merge range (a quarter of a top-n CTA) needs a thread per float4 of a head's "
              "output, dv up to 256 (the constructor's limit)");
// kSums: the parts left block sums (dims.sums_q > 0), not every compressed score.
template <bool kTrace, bool kSums>
__global__ void __launch_bounds__(kTopkThreads, kTopkCtasPerSm) topk_kernel(const DecodeParams p) {
  const DecodeDims& m = p.dims;
  trace_mark<kTrace>(p, kTraceTopk, 0);  // start
  wait_for_previous_kernel();
  trace_mark<kTrace>(p, kTraceTopk, 1);  // released
  // 16-byte aligned: block_topk keeps the blocks' 8-byte keys at its start.
  extern __shared__ __align__(16) float topk_smem[];
  const int bg = blockIdx.x, b = m.div_g.div(bg), g = bg - b * m.G, y = blockIdx.y;
  if (y < m.sel_chunks) {
    block_topk<kSums>(m, p.pos, b, bg, y, p.scores, p.part_ml, p.cand, topk_smem,
                      [&](int k) { trace_mark<kTrace>(p, kTraceTopk, 4 + k); });
    trace_mark<kTrace>(p, kTraceTopk, 2);  // a chunk's candidates written
    return;
  }
  // CTA y − sel_chunks: head h's three branches side by side – the compressed parts written this
  // step (half the threads), the window's and block 0's (a quarter each).
  const int h = y - m.sel_chunks, q = kTopkThreads / 4;
  const int cmp_hi = (num_cmp(m, p.pos[b]) + kPartKeys - 1) / kPartKeys;
  const MergeRange ranges[kNumBranches] = {
      {0, cmp_hi, m.slot_pre + kCmp, 0, 2 * q},
      {m.slot_win, m.slot_win + m.win_parts, m.slot_pre + kWin, 2 * q, q},
      {m.slot_block0, m.slot_block0 + m.block0_parts, m.slot_pre + kSel, 3 * q, q}};
  combine<true, kTopkThreads>(m, p.part_ml, p.part_o, b, g, h, ranges, nullptr);
  trace_mark<kTrace>(p, kTraceTopk, 3);  // a head's branches pre-merged
}

// Grid (cluster, B·G), one cluster of CTAs per (sequence, group): each CTA merges the chunks'
// candidates into the selection (CTA 0's second warp writes it out while the rows come; the lists
// are loaded with the position) and attends its parts k = rank, rank + cluster, … of the forced
// blocks c − 1, c (k < late_parts), then of the picked blocks, keeping their merged partial in its
// shared memory. Then each CTA pushes every head's partial into the inbox of the CTA that gates
// that head (push_partial), and gates its own share of the group's heads into o once its inbox is
// full: the top-n kernel's pre-merged partials (loaded while the pushes land) and every CTA's
// partial of the selected branch. No cluster barrier on the way: a CTA waits only for the bytes it
// reads. With kTma (NsaDecodeCuda::pick_maps_.on), the picked and forced blocks' rows come by TMA
// as the parts' do: per part, a key box and a value box of l_sel = 64 rows per block (two blocks a
// part), the row at position t then put in from the inputs, the rows past the count zeroed
// (tile_fix_rows) – instead of a row address per thread and 16-byte cp.async.
template <bool kTrace, bool kTma>
__global__ void __launch_bounds__(kPartThreads)
    picks_kernel(const DecodeParams p, const __grid_constant__ DecodePickMaps maps) {
  const DecodeDims& m = p.dims;
  trace_mark<kTrace>(p, kTracePicks, 0);  // start
  extern __shared__ __align__(16) unsigned char smem[];
  __shared__ KeyRows rows;
  __shared__ __align__(16) int picks[kMaxSel];
  __shared__ uint64_t received;     // the inbox's barrier: one arrival and its bytes
  __shared__ uint64_t rows_landed;  // kTma: the boxes' barrier, a phase per part
  const int rank = blockIdx.x, cluster = gridDim.x, bg = blockIdx.y, b = m.div_g.div(bg),
            g = bg - b * m.G;
  const Tile tl = kTma ? carve_tile_aligned64(smem) : carve_tile(smem, m.dk, m.dv);
  unsigned char* after_tile = smem + (kTma ? kTileAlignSlack : 0) + tile_bytes(m.dk, m.dv);
  const SelectScratch scratch = carve_select(after_tile, m);
  unsigned char* after_select = after_tile + select_scratch_bytes(m.sel_chunks, m.n_sel);
  const SmemPartial own = carve_partial(after_select, m);
  const SmemPartial extra = carve_partial(after_select + smem_partial_bytes(m.hpg, m.dv), m);
  const Inbox inbox = carve_inbox(after_select + 2 * smem_partial_bytes(m.hpg, m.dv), m);
  // This CTA gates heads h0 .. h0 + nh − 1: it expects their partials from the other CTAs. The
  // barrier is armed and the cluster meets (its wait is before the first push) long before any
  // partial is ready.
  const int heads = (m.hpg + cluster - 1) / cluster, h0 = rank * heads;
  const int nh = max(0, min(heads, m.hpg - h0));
  const PreMergedTile premerged = carve_premerged(
      after_select + 2 * smem_partial_bytes(m.hpg, m.dv) + inbox_bytes(m.hpg, m.dv), heads, m);
  if (threadIdx.x == 0) {
    mbarrier_init_one(&received);
    mbarrier_expect_bytes(&received, static_cast<uint32_t>((cluster - 1) * nh * (m.dv + 2) * 4));
    if (kTma) mbarrier_init_one(&rows_landed);
    mbarrier_init_fence();
  }
  cluster_arrive_relaxed();
  // The position and q were written before the kernel before this one began (dependent_launch.cuh).
  const int t = p.pos[b];
  tile_issue_q(m, p.q, b, g, tl);
  cp_async_commit();
  store_gates(m, p.gate, bg, h0, nh, premerged);  // written kernels before (a barrier follows)
  const InputRows in = input_rows(p, kSel, b, g);
  // kTma: the token's rows, put into the tile where a part holds position t.
  const uint4 piece = kTma ? load_input_piece(m, in.k, in.v) : make_uint4(0, 0, 0, 0);
  // The selection's code twice (p.warm_picks): a dry pass before the wait on empty candidate lists
  // (its picks are overwritten), then the real one – 5 % off the attention at B = 1
  // (docs/perf.md), most likely because the instructions are fetched while the kernel before still
  // runs: the selection phase itself did not shrink in the trace.
  const SelectPlan plan = select_plan(m, t);  // before the wait, as the position allows
  int npicks = 0;
#pragma unroll 1
  for (int pass = p.warm_picks ? 0 : 1; pass < 2; ++pass) {
    if (pass == 0) {
      for (int i = threadIdx.x; i < candidate_keys(m.sel_chunks, m.n_sel); i += blockDim.x)
        scratch.cand[i] = kNoCandidate;
    } else {
      wait_for_previous_kernel_only();  // the next kernel may start once the selection is made
      trace_mark<kTrace>(p, kTracePicks, 1);  // released
      issue_candidates(m, p.cand, bg, scratch);
      issue_premerged(m, p.part_ml, p.part_o, bg, h0, nh, premerged);
      cp_async_commit();
    }
    cp_async_wait<0>();
    __syncthreads();
    if (pass == 1) trace_mark<kTrace>(p, kTracePicks, 2);  // candidates landed
    npicks = select_blocks(m, plan, scratch, picks, [](int) {});
  }
  trace_mark<kTrace>(p, kTracePicks, 3);  // selected
  let_next_kernel_start();
  // CTA 0's second warp writes the selection out, ascending, while the first part's rows come.
  const auto publish_selection = [&](int y) {
    if (rank == 0 && y == rank && threadIdx.x / 32 == 1)
      write_selection(m, plan, picks, p.sel + static_cast<int64_t>(bg) * m.n_sel);
  };
  uint32_t phase = 0;  // kTma: the parts whose boxes rows_landed has seen
  for (int y = rank; y < m.late_parts + m.pick_parts; y += cluster) {
    const bool late = y < m.late_parts;
    const int k = late ? y : y - m.late_parts;
    const auto block_at = [&](int e) { return late ? late_block(m, t, e) : picks[e]; };
    const SelPart sp = sel_part(m, t, k, late ? num_late(m, t) : npicks, block_at);
    if (kTma) {
      // The part's blocks, l_sel = 64 rows each; the last may hold t (then it is the part's last).
      if (threadIdx.x == 0 && sp.count > 0) {
        ::cuda::ptx::fence_proxy_async(::cuda::ptx::space_shared);  // the tile's generic writes
        mbarrier_expect_bytes(&rows_landed, row_boxes_bytes(sp.nseg * m.l_sel));
        for (int e = 0; e < sp.nseg; ++e) {
          const int32_t at = static_cast<int32_t>(
              cache_row(b, g, m.G, m.max_len, static_cast<int64_t>(block_at(sp.e0 + e)) * m.l_sel));
          tile_issue_row_boxes(tl, e * m.l_sel, &maps.k, &maps.v, at, &rows_landed);
        }
      }
      int patch = -1;  // t's row in the tile, if the part's last block holds it
      if (sp.count > 0) {
        const int at_t = t - block_at(sp.e0 + sp.nseg - 1) * m.l_sel;
        if (at_t >= 0 && at_t < m.l_sel) patch = (sp.nseg - 1) * m.l_sel + at_t;
      }
      publish_selection(y);
      cp_async_wait<0>();  // the query (the first part)
      if (sp.count > 0) mbarrier_wait(&rows_landed, phase++ % 2);
      tile_fix_rows(m, tl, sp.count, patch, piece);
      __syncthreads();
    } else {
      for (int c = threadIdx.x; c < sp.count; c += blockDim.x) {
        const int64_t pos = static_cast<int64_t>(block_at(sp.e0 + m.div_seg.div(c))) * m.l_sel +
                            sp.off + m.div_seg.mod(c);
        rows.k[c] = pos == t ? in.k : row(p.k_sel, b, m.max_len, pos, g, m, m.dk);
        rows.v[c] = pos == t ? in.v : row(p.v_sel, b, m.max_len, pos, g, m, m.dv);
      }
      __syncthreads();
      tile_issue_kv(m, tl, rows, sp.count);
      cp_async_commit();
      publish_selection(y);
      cp_async_wait<0>();
      __syncthreads();
    }
    if (y == rank) trace_mark<kTrace>(p, kTracePicks, 4);  // the first part's rows landed
    const SmemPartial out = y == rank ? own : extra;       // later parts are folded into own
    if (sp.count > 0) {
      tile_attend_part<false>(m, tl, sp.count, ScoresOut{}, out.ml, out.o);
    } else {
      write_empty(m, out.ml);
    }
    __syncthreads();  // the tile and the rows are the next part's; the partial is written
    if (y != rank) fold_partial(m, own, extra);
  }
  trace_mark<kTrace>(p, kTracePicks, 5);  // parts attended
  cluster_wait();  // every CTA's inbox barrier is armed (met long ago: no wait in practice)
  push_partial(m, own, inbox, &received, rank, heads);
  __syncthreads();  // the CTA's own partials in its inbox
  // An output element a thread, from the pre-merged partials in shared memory (copied with the
  // candidates) and the cluster's partials in the inbox.
  const int items = nh * m.dv;
  if (items == 0) return;  // its pushes need nothing of it: they complete on their receivers
  mbarrier_wait_cluster(&received, 0);
  trace_mark<kTrace>(p, kTracePicks, 6);  // the inbox is full
  const int64_t o_row = static_cast<int64_t>(bg) * m.hpg;
  for (int item = threadIdx.x; item < items; item += blockDim.x) {
    const int hl = item / m.dv, e = item % m.dv;
    const PreMerged pm = premerged_at(m, premerged, hl, e);
    p.o[(o_row + h0 + hl) * m.dv + e] =
        __float2bfloat16(gate_branches(m, pm, inbox, cluster, heads, hl, e));
  }
  trace_mark<kTrace>(p, kTracePicks, 7);  // combined
}

// The top-n kernel's instance: with or without trace points, from block sums or scores.
using TopkKernel = void (*)(DecodeParams);
TopkKernel topk_kernel_for(bool traced, bool sums) {
  if (traced) return sums ? topk_kernel<true, true> : topk_kernel<true, false>;
  return sums ? topk_kernel<false, true> : topk_kernel<false, false>;
}

// The picks kernel's instance: with or without trace points, its rows by TMA or by cp.async – two
// instances, so the cp.async path's code is what it was without the TMA path.
using PicksKernel = void (*)(DecodeParams, DecodePickMaps);
PicksKernel picks_kernel_for(bool traced, bool tma) {
  if (traced) return tma ? picks_kernel<true, true> : picks_kernel<true, false>;
  return tma ? picks_kernel<false, true> : picks_kernel<false, false>;
}

// Dense decoding, grid (B, H): one head's parts over 0..t merged into o.
__global__ void __launch_bounds__(kPartThreads) dense_combine_kernel(const DecodeParams p) {
  const DecodeDims& m = p.dims;
  wait_for_previous_kernel();
  const int b = blockIdx.x, h = blockIdx.y, t = p.pos[b];
  const MergeRange all[1] = {{0, t / kPartKeys + 1, 0, 0, kPartThreads}};
  combine<false, kPartThreads>(m, p.part_ml, p.part_o, b, h / m.hpg, h % m.hpg, all, p.o);
}

__global__ void fill_uniform_kernel(bf16* x, int64_t n, uint64_t seed, float half_range) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    uint64_t z = seed + 0x9e3779b97f4a7c15ull * static_cast<uint64_t>(i + 1);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    const float u = static_cast<float>(z >> 40) / static_cast<float>(1 << 24);  // [0, 1)
    x[i] = __float2bfloat16((u * 2.0f - 1.0f) * half_range);
  }
}

// One L1 / shared-memory split for every kernel of the step, the largest shared: an SM holding
// one kernel's CTAs cannot take the next kernel's early (programmatic dependent launch) under a
// different split, which it would have to drain to change. A hint to the driver; not measured.
template <typename Kernel>
void prefer_shared_carveout(Kernel kernel) {
  NSA_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                      cudaSharedmemCarveoutMaxShared));
}

int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

}  // namespace

NsaDecodeCuda::NsaDecodeCuda(const NsaConfig& cfg, int64_t batch, int64_t max_len, bool dense)
    : cfg_(cfg), B_(batch), max_len_(max_len), dense_(dense) {
  cfg.validate();
  NSA_CHECK(batch > 0 && max_len > 0, "decode: batch and max length must be positive");
  NSA_CHECK(cfg.phi == Phi::kAvg, "decode on the GPU supports phi = avg only");
  const int64_t hpg = cfg.heads_per_group();
  NSA_CHECK(hpg <= kMaxHeadsPerGroup && cfg.dk <= 256 && cfg.dv <= 256 && cfg.dk % 16 == 0 &&
                cfg.dv % 16 == 0,
            "decode on the GPU supports up to ", kMaxHeadsPerGroup,
            " heads per group and dk, dv up to 256 and multiples of 16; got ", hpg, ", ", cfg.dk,
            ", ", cfg.dv);
  NSA_CHECK(cfg.n_sel <= kMaxSel - 3, "decode on the GPU supports n_sel <= ", kMaxSel - 3, ", got ",
            cfg.n_sel);
  const int64_t G = cfg.groups, dk = cfg.dk, dv = cfg.dv, H = cfg.heads;
  max_cmp_ = std::max<int64_t>(1, cfg.num_compressed(max_len));
  const TopkChunks chunking = decoder_topk_chunks(max_len, cfg.l_sel, B_ * cfg.groups,
                                                  cfg.heads_per_group(), current_sm_count());
  sel_chunk_ = chunking.chunk;
  sel_chunks_ = chunking.chunks;
  NSA_CHECK(block_topk_smem_bytes() <= 160 * 1024, "decode on the GPU: max length ", max_len,
            " needs more shared memory for the block scores than a CTA has; shorten it");
  if (dense) {
    dense_parts_ = ceil_div(max_len, kPartKeys);
    slots_ = dense_parts_;
  } else {
    const int64_t bpp = std::max<int64_t>(1, kPartKeys / cfg.l_sel);
    const int64_t sub = ceil_div(cfg.l_sel, kPartKeys);
    cmp_parts_ = ceil_div(max_cmp_, kPartKeys);
    win_parts_ = ceil_div(std::min(cfg.w, max_len), kPartKeys);
    block0_parts_ = sub;
    late_parts_ = sub == 1 ? ceil_div(2, bpp) : 2 * sub;
    // Picks exist only once c ≥ 3, when the three forced blocks are distinct: n_sel − 3 at most.
    pick_parts_ = sub == 1 ? ceil_div(cfg.n_sel - 3, bpp) : (cfg.n_sel - 3) * sub;
    picks_cluster_ =
        static_cast<unsigned>(std::min<int64_t>(kPicksCluster, late_parts_ + pick_parts_));
    slots_ = cmp_parts_ + win_parts_ + block0_parts_ + kNumBranches;
  }
  const int64_t grid_y = dense ? dense_parts_ : cmp_parts_ + win_parts_ + block0_parts_;
  NSA_CHECK(grid_y <= 65535, "decode on the GPU: max length ", max_len, " needs ", grid_y,
            " parts per sequence and group, more than a grid holds (65535); shorten it");
  k_sel_.resize(B_ * max_len * G * dk);
  v_sel_.resize(B_ * max_len * G * dv);
  if (!dense) {
    k_win_.resize(B_ * cfg.w * G * dk);
    v_win_.resize(B_ * cfg.w * G * dv);
    k_raw_.resize(B_ * cfg.l * G * dk);
    v_raw_.resize(B_ * cfg.l * G * dv);
    k_cmp_.resize(B_ * max_cmp_ * G * dk);
    v_cmp_.resize(B_ * max_cmp_ * G * dv);
    // The block sums where the parts' scores are narrow and a block is four strides of d with
    // l = 2d (decode_params.cuh); their rows cover every compressed part's keys.
    if (narrow_scores(static_cast<int>(dk), static_cast<int>(dv), static_cast<int>(hpg)) &&
        cfg.l == 2 * cfg.d && cfg.l_sel == 4 * cfg.d) {
      sums_q_ = cmp_parts_ * kPartKeys / 4;
      scores_.resize(B_ * G * hpg * block_sums_floats(sums_q_));
    } else {
      scores_.resize(B_ * H * max_cmp_);
    }
    scores_.zero();
    candidates_.resize(B_ * G * candidate_keys(sel_chunks_, cfg.n_sel));
    sel_.resize(B_ * G * cfg.n_sel);
    sel_.zero();
  }
  // The parts' rows by the copy engine (two boxes, one thread) at every batch: it issues in 0.2 µs
  // what cp.async issues in 0.9-1.8 (nsa_decode_loads, H200) and leaves the warps free. With the
  // caches group-major a part's rows are one block of memory; while they were [B, rows, G, d]
  // (128-byte rows 256 bytes apart) TMA paid only up to four CTAs an SM. Measured on the H200
  // (docs/perf.md, thirty-ninth session; with the picks' below): attention 64k B8 0.220 -> 0.198
  // ms, B16 0.312 -> 0.307, 128k B16 0.490 -> 0.466, our dense decoding at B16 −8 to −10 %. G ≥ 2:
  // the shapes measured (a box past the row's 64 columns is zeros either way).
  part_maps_.on =
      dk == kTmaHeadDim && dv == kTmaHeadDim && G >= 2 && B_ * G * max_len < (int64_t{1} << 31);
  if (part_maps_.on) {
    const bf16* const caches[3][2] = {
        {k_cmp_.get(), v_cmp_.get()}, {k_win_.get(), v_win_.get()}, {k_sel_.get(), v_sel_.get()}};
    // Every (sequence, group)'s rows one after another (cache_row, decode_params.cuh).
    const int64_t rows[3] = {B_ * G * max_cmp_, B_ * G * cfg.w, B_ * G * max_len};
    for (int i = 0; i < 3; ++i) {
      if (caches[i][0] == nullptr) continue;  // dense: the selected caches only
      part_maps_.k[i] =
          make_row_box_map(caches[i][0], rows[i], kTmaHeadDim, kTmaHeadDim, kPartKeys, true);
      part_maps_.v[i] = make_row_box_map(caches[i][1], rows[i], kTmaHeadDim,
                                         tile_stride(kTmaHeadDim), kPartKeys, false);
    }
  }
  // The picks' rows by TMA where a part is two 64-row blocks (m7c: l_sel = 64): 64k, B = 1
  // attention 0.161 -> 0.156 ms (H200, docs/perf.md); at every batch since the caches are
  // group-major (before, only up to a CTA an SM): 128k B16 0.484 -> 0.475 ms beside the parts'.
  pick_maps_.on = !dense && dk == kTmaHeadDim && dv == kTmaHeadDim && G >= 2 && cfg.l_sel == 64 &&
                  kPartKeys == 2 * cfg.l_sel && B_ * G * max_len < (int64_t{1} << 31);
  if (pick_maps_.on) {
    pick_maps_.k =
        make_row_box_map(k_sel_.get(), B_ * G * max_len, kTmaHeadDim, kTmaHeadDim, cfg.l_sel, true);
    pick_maps_.v = make_row_box_map(v_sel_.get(), B_ * G * max_len, kTmaHeadDim,
                                    tile_stride(kTmaHeadDim), cfg.l_sel, false);
  }
  NSA_CHECK(
      dense || picks_smem_bytes() <= 220 * 1024, "decode on the GPU: dk ", dk, ", dv ", dv, " and ",
      hpg, " heads per group need ", picks_smem_bytes(),
      " bytes of shared memory in a picks CTA, more than it has (220 KiB); use smaller heads");
  // Dynamic shared memory beyond the default 48 KiB (the staged tile, and the picks' selection
  // scratch): raised, never lowered, so every decoder alive (of any shape) can still launch.
  for (const bool traced : {false, true}) {  // the kernels with and without trace points
    allow_dynamic_smem(traced ? parts_kernel<true> : parts_kernel<false>, parts_smem_bytes());
    if (!dense) {
      allow_dynamic_smem(topk_kernel_for(traced, sums_q_ > 0), block_topk_smem_bytes());
      allow_dynamic_smem(picks_kernel_for(traced, pick_maps_.on), picks_smem_bytes());
    }
    prefer_shared_carveout(traced ? parts_kernel<true> : parts_kernel<false>);
    prefer_shared_carveout(topk_kernel_for(traced, sums_q_ > 0));
    if (!dense) prefer_shared_carveout(picks_kernel_for(traced, pick_maps_.on));
  }
  prefer_shared_carveout(dense_combine_kernel);
  // The picks' dry pass where their grid is at most one CTA an SM (batch 1 to 8 for m7c): there the
  // CTAs wait on the top-n with time to spare; at 64k, B = 16 it measured 2.5 % slower
  // (docs/perf.md).
  warm_picks_ = !dense && kernel_ctas(kTracePicks) <= current_sm_count();
  // At most two picks CTAs an SM where the rule wants it (decode_chunks.h).
  if (picks_spread_wanted(kernel_ctas(kTracePicks), current_sm_count())) spread_picks();
  part_ml_.resize(B_ * G * slots_ * hpg * 2);
  part_o_.resize(B_ * G * slots_ * hpg * dv);
}

void NsaDecodeCuda::step(const bf16* q, const bf16* const k[kNumBranches],
                         const bf16* const v[kNumBranches], const bf16* const gate[kNumBranches],
                         const int32_t* pos, bf16* o, cudaStream_t stream) {
  const NsaConfig& c = cfg_;
  DecodeParams p{};
  DecodeDims& m = p.dims;
  m.G = static_cast<int>(c.groups);
  m.hpg = static_cast<int>(c.heads_per_group());
  m.dk = static_cast<int>(c.dk);
  m.dv = static_cast<int>(c.dv);
  m.l = static_cast<int>(c.l);
  m.d = static_cast<int>(c.d);
  m.l_sel = static_cast<int>(c.l_sel);
  m.n_sel = static_cast<int>(c.n_sel);
  m.w = static_cast<int>(c.w);
  m.max_len = max_len_;
  m.max_cmp = max_cmp_;
  m.sub = static_cast<int>(ceil_div(c.l_sel, kPartKeys));
  m.bpp = m.sub == 1 ? static_cast<int>(kPartKeys / c.l_sel) : 1;
  m.seg_len = m.sub == 1 ? m.l_sel : kPartKeys;
  m.cmp_parts = static_cast<int>(cmp_parts_);
  m.win_parts = static_cast<int>(win_parts_);
  m.block0_parts = static_cast<int>(block0_parts_);
  m.late_parts = static_cast<int>(late_parts_);
  m.pick_parts = static_cast<int>(pick_parts_);
  m.dense_parts = static_cast<int>(dense_parts_);
  m.slot_win = m.cmp_parts;
  m.slot_block0 = m.slot_win + m.win_parts;
  m.slot_pre = m.slot_block0 + m.block0_parts;
  m.slots = static_cast<int>(slots_);
  m.sel_chunk = static_cast<int>(sel_chunk_);
  m.sel_chunks = static_cast<int>(sel_chunks_);
  m.sums_q = static_cast<int>(sums_q_);
  m.scale = static_cast<float>(c.softmax_scale());
  m.div_d = FastDiv(m.d), m.div_lsel = FastDiv(m.l_sel), m.div_seg = FastDiv(m.seg_len);
  m.div_l = FastDiv(m.l), m.div_w = FastDiv(m.w), m.div_g = FastDiv(m.G);
  p.dense = dense_;
  p.pos = pos;
  p.q = q;
  for (int br = 0; br < kNumBranches; ++br) {
    p.k_in[br] = k[c.kv_index(br)];
    p.v_in[br] = v[c.kv_index(br)];
    p.gate[br] = gate[br];
  }
  p.k_sel = k_sel_.get(), p.v_sel = v_sel_.get(), p.k_win = k_win_.get(), p.v_win = v_win_.get();
  p.k_raw = k_raw_.get(), p.v_raw = v_raw_.get(), p.k_cmp = k_cmp_.get(), p.v_cmp = v_cmp_.get();
  p.scores = scores_.get(), p.part_ml = part_ml_.get(), p.part_o = part_o_.get();
  p.cand = candidates_.get();
  p.warm_picks = warm_picks_;
  p.sel = sel_.get();
  p.o = o;
  p.trace = nullptr;
  if (trace_.size() > 0) {
    p.trace =
        trace_.get() + (trace_next_++ % trace_calls_) * kTraceKernels * trace_ctas_ * kTracePhases;
  }
  p.trace_ctas = trace_ctas_;
  const unsigned BG = static_cast<unsigned>(B_ * m.G);
  const unsigned parts =
      static_cast<unsigned>(dense_ ? dense_parts_ : cmp_parts_ + win_parts_ + block0_parts_);
  const bool traced = p.trace != nullptr;
  launch_dependent(traced ? parts_kernel<true> : parts_kernel<false>, dim3(BG, parts),
                   dim3(kPartThreads), parts_smem_bytes(), stream, p, part_maps_);
  if (dense_) {
    launch_dependent(dense_combine_kernel,
                     dim3(static_cast<unsigned>(B_), static_cast<unsigned>(c.heads)),
                     dim3(kPartThreads), 0, stream, p);
    return;
  }
  launch_dependent(topk_kernel_for(traced, m.sums_q > 0),
                   dim3(BG, static_cast<unsigned>(topk_grid_rows(sel_chunks_, m.hpg))),
                   dim3(kTopkThreads), block_topk_smem_bytes(), stream, p);
  launch_dependent_clusters(picks_kernel_for(traced, pick_maps_.on), dim3(picks_cluster_, BG),
                            picks_cluster_, dim3(kPartThreads), picks_smem_bytes(), stream, p,
                            pick_maps_);
}

void NsaDecodeCuda::fill_random(int64_t len, uint64_t seed, cudaStream_t stream) {
  NSA_CHECK(len >= 0 && len <= max_len_, "decode: fill length ", len, " is outside [0, ", max_len_,
            "]");
  uint64_t s = seed;
  for (DeviceBuffer<bf16>* buf :
       {&k_sel_, &v_sel_, &k_win_, &v_win_, &k_raw_, &v_raw_, &k_cmp_, &v_cmp_}) {
    if (buf->size() == 0) continue;
    launch_fill_uniform(buf->get(), buf->size(), s += 0x1234567ull, 1.0f, stream);
  }
}

namespace {
__global__ void advance_kernel(int32_t* pos, int64_t n) {
  wait_for_previous_kernel();  // a dependent launch: it starts while the step's last kernel runs
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < n) pos[i] += 1;
}
}  // namespace

void launch_fill_uniform(bf16* x, int64_t n, uint64_t seed, float half_range, cudaStream_t stream) {
  if (n == 0) return;
  fill_uniform_kernel<<<1024, 256, 0, stream>>>(x, n, seed, half_range);
  NSA_CUDA_LAUNCH_CHECK();
}

void launch_advance_positions(int32_t* pos, int64_t batch, cudaStream_t stream) {
  if (batch == 0) return;
  launch_dependent(advance_kernel, dim3(static_cast<unsigned>((batch + 255) / 256)), dim3(256), 0,
                   stream, pos, batch);
}

int64_t NsaDecodeCuda::kv_bytes_per_step(int64_t t) const {
  const NsaConfig& c = cfg_;
  int64_t tokens = t + 1;
  if (!dense_) {
    const int64_t blk = t / c.l_sel, chosen = std::min(c.n_sel, blk + 1);
    tokens = c.num_visible_compressed(t) + (chosen - 1) * c.l_sel + (t - blk * c.l_sel + 1) +
             std::min(c.w, t + 1);
  }
  return c.groups * tokens * (c.dk + c.dv) * static_cast<int64_t>(sizeof(bf16));
}

static_assert(NsaDecodeCuda::kTraceKernels == kTraceKernels &&
                  NsaDecodeCuda::kTracePhases == kTracePhases,
              "the trace's layout is decode_params.cuh's");

// CTAs of each kernel of a step: their grids' sizes (step()).
int64_t NsaDecodeCuda::kernel_ctas(int kernel) const {
  const int64_t BG = B_ * cfg_.groups;
  switch (kernel) {
    case kTraceParts:
      return BG * (dense_ ? dense_parts_ : cmp_parts_ + win_parts_ + block0_parts_);
    case kTraceTopk:
      return dense_ ? 0 : BG * topk_grid_rows(sel_chunks_, cfg_.heads_per_group());
    default:
      return dense_ ? 0 : BG * picks_cluster_;
  }
}

std::string NsaDecodeCuda::plan() const {
  const std::string parts = "parts " + std::to_string(kernel_ctas(kTraceParts)) +
                            (parts_rows_by_tma() ? " TMA, " : " cp.async, ") +
                            std::to_string(parts_ctas_per_sm()) + " an SM";
  if (dense_) return parts + " | combine " + std::to_string(B_ * cfg_.heads);
  return parts + " | top-n " + std::to_string(kernel_ctas(kTraceTopk)) + ", chunks of " +
         std::to_string(sel_chunk_) + (selection_by_block_sums() ? ", block sums" : ", scores") +
         " | picks " + std::to_string(kernel_ctas(kTracePicks)) + " in clusters of " +
         std::to_string(picks_cluster_) + (picks_rows_by_tma() ? ", TMA" : ", cp.async") +
         (picks_spread() ? ", spread" : "") + (warm_picks_ ? ", warm" : "");
}

void NsaDecodeCuda::enable_trace(cudaStream_t stream, int64_t calls) {
  NSA_CHECK(calls > 0, "decode trace: calls must be positive, got ", calls);
  trace_ctas_ = 0;
  for (int k = 0; k < kTraceKernels; ++k) trace_ctas_ = std::max(trace_ctas_, kernel_ctas(k));
  trace_calls_ = calls, trace_next_ = 0;
  trace_.resize(calls * kTraceKernels * trace_ctas_ * kTracePhases);
  trace_.zero(stream);  // on the stream the traced steps run on: ordered before their marks
}

NsaDecodeCuda::Trace NsaDecodeCuda::trace() const {
  Trace tr;
  for (int k = 0; k < kTraceKernels; ++k) tr.ctas[k] = kernel_ctas(k);
  tr.stride = trace_ctas_;
  tr.calls = trace_calls_;
  NSA_CUDA_CHECK(cudaDeviceSynchronize());
  tr.t = trace_.download();
  return tr;
}

const char* NsaDecodeCuda::trace_kernel(int kernel) {
  static const char* const names[kTraceKernels] = {"parts", "top-n", "picks"};
  return kernel >= 0 && kernel < kTraceKernels ? names[kernel] : nullptr;
}

const char* NsaDecodeCuda::trace_phase(int kernel, int phase) {
  static const char* const names[kTraceKernels][kTracePhases] = {
      {"start", "cache rows issued", "released", "landed", "attended", "rows addressed", nullptr,
       nullptr},
      {"start", "released", "chunk written", "head pre-merged", "stats merged", "probs staged",
       "blocks scored", nullptr},
      {"start", "released", "candidates landed", "selected", "first rows landed", "attended",
       "inbox full", "combined"}};
  if (kernel < 0 || kernel >= kTraceKernels || phase < 0 || phase >= kTracePhases) return nullptr;
  return names[kernel][phase];
}

// The parts kernel's tile, with the slack that aligns it for the copy engine's boxes.
size_t NsaDecodeCuda::parts_smem_bytes() const {
  return tile_bytes(static_cast<int>(cfg_.dk), static_cast<int>(cfg_.dv)) +
         (part_maps_.on ? kTileAlignSlack : 0);
}

int NsaDecodeCuda::parts_ctas_per_sm() const {
  int ctas = 0;
  NSA_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&ctas, parts_kernel<false>,
                                                               kPartThreads, parts_smem_bytes()));
  return ctas;
}

// The picks kernel's tile, its selection scratch, its partial and a later part's, its inbox – or
// picks_smem_floor_ if that is more.
size_t NsaDecodeCuda::picks_smem_bytes() const {
  const int hpg = static_cast<int>(cfg_.heads_per_group()), dv = static_cast<int>(cfg_.dv);
  const size_t need = (pick_maps_.on ? kTileAlignSlack : 0) +
                      tile_bytes(static_cast<int>(cfg_.dk), dv) +
                      select_scratch_bytes(sel_chunks_, cfg_.n_sel) +
                      2 * smem_partial_bytes(hpg, dv) + inbox_bytes(hpg, dv) +
                      premerged_tile_bytes(static_cast<int>(ceil_div(hpg, picks_cluster_)), dv);
  return std::max(need, picks_smem_floor_);
}

// At most two picks CTAs an SM (the constructor says where): each asks for a third of an SM's
// shared memory (it uses no more than picks_smem_bytes' other terms), kept only if every cluster
// of the grid still fits at once (cudaOccupancyMaxActiveClusters). Without it up to four can share
// an SM (shared memory and registers allow four) while others hold none – our reading of why it
// helps, not measured.
void NsaDecodeCuda::spread_picks() {
  int dev = 0, sm_smem = 0, reserved = 0;
  NSA_CUDA_CHECK(cudaGetDevice(&dev));
  NSA_CUDA_CHECK(
      cudaDeviceGetAttribute(&sm_smem, cudaDevAttrMaxSharedMemoryPerMultiprocessor, dev));
  NSA_CUDA_CHECK(cudaDeviceGetAttribute(&reserved, cudaDevAttrReservedSharedMemoryPerBlock, dev));
  size_t floor = 0;
  for (const bool traced : {false, true}) {
    cudaFuncAttributes fa{};
    NSA_CUDA_CHECK(cudaFuncGetAttributes(&fa, picks_kernel_for(traced, pick_maps_.on)));
    const int64_t f = sm_smem / 3 + 1 - reserved - static_cast<int64_t>(fa.sharedSizeBytes);
    floor = std::max(floor, static_cast<size_t>(std::max<int64_t>(f, 0)));
  }
  if (floor <= picks_smem_bytes()) return;
  const size_t before = picks_smem_floor_;
  picks_smem_floor_ = floor;
  for (const bool traced : {false, true})
    allow_dynamic_smem(picks_kernel_for(traced, pick_maps_.on), picks_smem_bytes());
  cudaLaunchAttribute attr = cluster_attribute(picks_cluster_);  // as step() launches them
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(picks_cluster_, static_cast<unsigned>(B_ * cfg_.groups));
  config.blockDim = dim3(kPartThreads);
  config.dynamicSmemBytes = picks_smem_bytes();
  config.attrs = &attr;
  config.numAttrs = 1;
  int clusters = 0;
  NSA_CUDA_CHECK(
      cudaOccupancyMaxActiveClusters(&clusters, picks_kernel_for(false, pick_maps_.on), &config));
  if (clusters < B_ * cfg_.groups) picks_smem_floor_ = before;
}

// The keys of a chunk's blocks, and the group probabilities of the compressed tokens that meet it
// (block sums: the weights of its warps, fewer).
size_t NsaDecodeCuda::block_topk_smem_bytes() const {
  const int64_t probs = (sel_chunk_ * cfg_.l_sel + cfg_.l) / cfg_.d + 2;
  const int64_t gp =
      sums_q_ > 0 ? std::max<int64_t>(probs, sum_warps(sel_chunk_) * kSumHeads) : probs;
  return static_cast<size_t>(sel_chunk_) * sizeof(decode::Candidate) +
         static_cast<size_t>(gp) * sizeof(float);
}

size_t NsaDecodeCuda::bytes() const {
  return k_sel_.bytes() + v_sel_.bytes() + k_win_.bytes() + v_win_.bytes() + k_raw_.bytes() +
         v_raw_.bytes() + k_cmp_.bytes() + v_cmp_.bytes() + scores_.bytes() + part_ml_.bytes() +
         part_o_.bytes() + candidates_.bytes() + sel_.bytes();
}

}  // namespace nsa::cuda
