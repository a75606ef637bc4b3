// The shared launch sequences (see nsa_launch.h). φ = avg runs the compress_avg kernels, φ = mlp
// the CompressMlp functions (cuBLAS). One stream, so every accumulation happens in a fixed order.
#include "nsa_launch.h"

#include <algorithm>

#include "common/convert.h"
#include "device.h"
#include "nsa_backward_dkdv.h"
#include "nsa_kernels.h"

namespace nsa::cuda {

int64_t win_dkdv_chunks(const NsaParams& p) {
  const int64_t ctas = (p.T + kDkdvUnitRows - 1) / kDkdvUnitRows * p.G;
  if (ctas >= 1024) return 1;
  const int64_t slots = int64_t{dkdv_ctas_per_sm(p.dk)} * current_sm_count();
  const auto waves = [&](int64_t n) { return (n + slots - 1) / slots; };
  // Two chunks take ⌈2·ctas / slots⌉ waves of half the work each.
  return waves(kWinChunks * ctas) < kWinChunks * waves(ctas) ? kWinChunks : 1;
}

int64_t dkdv_partial_floats(const NsaParams& p) {
  return std::max(std::max(kSelChunks, kWinChunks) * p.T, kCmpChunks * p.C) * p.G * (p.dk + p.dv);
}

namespace {

// bf16 copies of a K/V pair in one launch (a null or empty pair member is skipped; nothing to do:
// no launch).
void convert_kv(const float* k, bf16* k16, int64_t nk, const float* v, bf16* v16, int64_t nv,
                cudaStream_t stream) {
  F32ToBf16Batch batch;
  batch.add(k, k16, nk);
  batch.add(v, v16, nv);
  launch_f32_to_bf16_batch(batch, stream);
}

// The bf16 copies of the compressed K/V (the attention kernels' operands).
void convert_compressed_kv(const NsaParams& p, cudaStream_t stream) {
  convert_kv(p.k_cmp, p.k_cmp_bf16, p.C * p.G * p.dk, p.v_cmp, p.v_cmp_bf16, p.C * p.G * p.dv,
             stream);
}

// The bf16 copies of branch b's K/V gradient, where the caller wants them (p.d_k_bf16), once the
// gradient's last writer is issued on `stream` – for the writers that only write fp32 (φ = mlp's
// GEMMs, the block-major selected branch when its rows take several passes); the window's dK/dV,
// the query-major selected branch's, the one-pass block-major one and φ = avg's backward write the
// bf16 gradient themselves. Each copy overlaps the rest
// of the backward instead of following it.
void convert_kv_grads(const NsaParams& p, int b, cudaStream_t stream) {
  convert_kv(p.d_k[b], p.d_k_bf16[b], p.T * p.G * p.dk, p.d_v[b], p.d_v_bf16[b], p.T * p.G * p.dv,
             stream);
}

}  // namespace

void launch_nsa_forward(const NsaParams& p, const NsaTables& t, const NsaScratch& s,
                        cudaStream_t stream) {
  // Block-major: the window branch first and without combining – on the side stream when forked
  // (it needs neither the compression nor the selection) – and the selected branch's merge
  // combines the three into o, after the window's event 1 when forked. The same arithmetic
  // either way.
  const bool block_major = s.sel_kernel == SelectedKernel::kBlockMajor;
  const StreamFork* fork = block_major ? s.fork : nullptr;
  if (block_major) {
    const cudaStream_t win_stream = fork ? fork->side() : stream;
    if (fork) fork->record(0, stream), fork->wait(win_stream, 0);
    NsaParams window_only = p;
    window_only.o = nullptr;
    launch_window_forward(window_only, t.row_tiles, t.n_row_tiles, win_stream);
    if (fork) fork->record(1, win_stream);
  }
  if (s.mlp_k) {
    compress_mlp_hidden(s.blas, p, *s.mlp_k, p.k[0], stream);
    compress_mlp_output(s.blas, *s.mlp_k, p.k_cmp, stream);
    compress_mlp_hidden(s.blas, p, *s.mlp_v, p.v[0], stream);
    compress_mlp_output(s.blas, *s.mlp_v, p.v_cmp, stream);
    if (s.device_layout) {  // padding rows hold W2ᵀ·silu(b1) + b2: make them zeros, as with avg
      launch_zero_compressed_padding(p, *s.device_layout, p.k_cmp, p.dk, stream);
      launch_zero_compressed_padding(p, *s.device_layout, p.v_cmp, p.dv, stream);
    }
  } else {
    launch_compress_avg_forward(p, stream);
  }
  convert_compressed_kv(p, stream);
  launch_compressed_forward(p, t.row_tiles, t.n_row_tiles, stream);
  launch_select_blocks(p, t.row_tiles, t.n_row_tiles, stream, s.select_q);
  if (block_major) {
    run_sel_block_major_forward(p, s.sel_block_major, stream, true,
                                fork ? fork->event(1) : nullptr);
    // The merge joined the side stream already; this wait also joins it when there was no merge
    // (no rows), as a CUDA graph capture requires.
    if (fork) fork->wait(stream, 1);
  } else {
    launch_selected_forward(p, stream);
    launch_window_forward(p, t.row_tiles, t.n_row_tiles, stream);
  }
}

void launch_nsa_backward_recompute(const NsaParams& p, const NsaScratch& s, cudaStream_t stream) {
  convert_compressed_kv(p, stream);
  if (s.mlp_k) {
    compress_mlp_hidden(s.blas, p, *s.mlp_k, p.k[0], stream);
    compress_mlp_hidden(s.blas, p, *s.mlp_v, p.v[0], stream);
  }
}

void launch_nsa_backward(const NsaConfig& cfg, NsaParams& p, const NsaTables& t,
                         const NsaScratch& s, cudaStream_t stream) {
  const bool shared = cfg.kv == KvMode::kShared;
  launch_nsa_backward_preprocess(p, stream);
  const bool block_major = s.sel_kernel == SelectedKernel::kBlockMajor;
  // d_q_bf16 (wanted by the caller) is written by the kernel that finishes d_q: the selected
  // branch's, query-major here or block-major's merge below.
  NsaParams unfinished = p;
  unfinished.d_q_bf16 = nullptr;
  // Forked (s.fork): the selected branch's index, dK/dV + dq partials and merge run on the side
  // stream after the preprocess; its d_q merge waits for the compressed + window dq (event 1);
  // the window and compressed dK/dV run here meanwhile; the side joins back at the end (event 2).
  const StreamFork* fork = block_major && !shared ? s.fork : nullptr;
  const cudaStream_t sel_stream = fork ? fork->side() : stream;
  if (fork) fork->record(0, stream), fork->wait(sel_stream, 0);
  build_sel_index(p, s.sel_index, sel_stream);
  attach_sel_index(p, s.sel_index);
  launch_compressed_and_window_dq(unfinished, t.row_tiles, t.n_row_tiles, stream);
  if (!block_major) launch_selected_dq(p, stream);
  if (fork) {  // launched first: the side stream has the higher priority
    fork->record(1, stream);
    // Event 3: its dK/dV done, so that this stream converts them beside the d_q merge.
    run_sel_block_major_backward(p, s.sel_block_major, t.sel_units, t.n_sel_units, false,
                                 sel_stream, fork->event(1), fork->event(3));
  }
  launch_nsa_backward_dkdv(p, Branch::kWin, t.row_tiles, t.n_row_tiles, win_dkdv_chunks(p), false,
                           s.partial, stream);
  // With shared K/V the window wrote the gradient first; the selected branch adds to it. (Without,
  // the window wrote its bf16 gradient where wanted.)
  if (block_major && !fork) {  // its dq too, in the same pass
    run_sel_block_major_backward(p, s.sel_block_major, t.sel_units, t.n_sel_units, shared, stream);
  } else if (!block_major) {
    launch_nsa_backward_dkdv(p, Branch::kSel, t.sel_units, t.n_sel_units, kSelChunks, shared,
                             s.partial, stream);
  }
  // The block-major pass writes the bf16 gradient itself where it can (one pass over the rows).
  const bool sel_bf16_done =
      block_major && sel_block_major_writes_bf16(p, s.sel_block_major, shared);
  if (block_major && !shared && !fork && !sel_bf16_done) convert_kv_grads(p, 1, stream);
  launch_nsa_backward_dkdv(p, Branch::kCmp, t.cmp_units, t.n_cmp_units, kCmpChunks, false,
                           s.partial, stream);
  if (s.mlp_k) {
    if (s.device_layout) {
      launch_zero_compressed_padding(p, *s.device_layout, p.d_k_cmp, p.dk, stream);
      launch_zero_compressed_padding(p, *s.device_layout, p.d_v_cmp, p.dv, stream);
    }
    compress_mlp_backward(s.blas, p, *s.mlp_k, p.d_k_cmp, p.d_k[0], shared, stream);
    compress_mlp_backward(s.blas, p, *s.mlp_v, p.d_v_cmp, p.d_v[0], shared, stream);
  } else {
    launch_compress_avg_backward(p, shared, stream);
  }
  // φ = avg's backward wrote the compressed branch's raw K/V (or the shared) gradient in bf16.
  if (s.mlp_k) convert_kv_grads(p, 0, stream);
  if (fork) {
    if (p.T > 0 && (p.d_k_bf16[1] || p.d_v_bf16[1]) && !sel_bf16_done) {  // event 3: T > 0
      fork->wait(stream, 3), convert_kv_grads(p, 1, stream);
    }
    fork->record(2, sel_stream), fork->wait(stream, 2);
  }
}

}  // namespace nsa::cuda
