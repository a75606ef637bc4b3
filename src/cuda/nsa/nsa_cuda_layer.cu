// NsaCudaLayer: buffers and layout tables (see nsa_cuda_layer.h); the launch sequences are
// nsa_launch.h's, shared with the C ABI.
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "common/convert.h"
#include "common/cublas_check.h"
#include "device.h"
#include "head_dims.h"
#include "nsa_cuda_layer.h"
#include "nsa_kernels.h"

namespace nsa::cuda {
namespace {

std::vector<bf16> to_bf16(const Tensor<float>& t) {
  std::vector<bf16> out(t.data.size());
  for (size_t i = 0; i < out.size(); ++i) out[i] = __float2bfloat16(t.data[i]);
  return out;
}

Tensor<float> from_bf16(const DeviceBuffer<bf16>& b, Shape shape) {
  const std::vector<bf16> host = b.download();
  Tensor<float> out(std::move(shape));
  for (size_t i = 0; i < host.size(); ++i) out.data[i] = __bfloat162float(host[i]);
  return out;
}

Tensor<float> from_f32(const DeviceBuffer<float>& b, Shape shape) {
  const std::vector<float> host = b.download();
  Tensor<float> out(std::move(shape));
  std::copy(host.begin(), host.end(), out.data.begin());
  return out;
}

template <typename T>
void upload(DeviceBuffer<T>& dst, const std::vector<T>& src) {
  dst.upload(src.data(), static_cast<int64_t>(src.size()));
}

}  // namespace

SelectedKernel default_selected_kernel(const NsaConfig& cfg) {
  return cfg.l_sel <= kSelBlockMajorMaxLsel ? SelectedKernel::kBlockMajor
                                            : SelectedKernel::kQueryMajor;
}

size_t NsaBackwardBuffers::bytes() const {
  size_t total = d_o.bytes() + d_q.bytes() + d_k_cmp.bytes() + d_v_cmp.bytes() + partial.bytes() +
                 sel_index.device_bytes() + sel_block_major.device_bytes();
  for (int c = 0; c < kNumBranches; ++c) {
    total += delta[c].bytes() + d_gate[c].bytes() + d_k[c].bytes() + d_v[c].bytes();
  }
  return total;
}

NsaCudaLayer::NsaCudaLayer(const NsaConfig& cfg, const SeqLayout& layout,
                           std::shared_ptr<NsaBackwardBuffers> backward_buffers)
    : cfg_(cfg),
      layout_(layout),
      sel_kernel_(default_selected_kernel(cfg)),
      bw_(backward_buffers ? std::move(backward_buffers) : std::make_shared<NsaBackwardBuffers>()) {
  NSA_CHECK(device_count() > 0, "--device cuda: no usable CUDA device (no GPU or no driver)");
  fork_ = std::make_unique<StreamFork>();
  cfg.validate();
  NSA_CHECK(head_dims_supported(cfg.dk, cfg.dv), "--device cuda: head dims (dk, dv) = (", cfg.dk,
            ", ", cfg.dv,
            ") are not built for the CUDA kernels; supported: ", supported_head_dims());
  const int64_t T = layout.total_tokens(), H = cfg.heads, G = cfg.groups;
  const std::vector<int64_t> cmp_off = layout.compressed_offsets(cfg);
  std::vector<int64_t> blk_off(layout.cu_seqlens.size(), 0), raw_start;
  std::vector<int32_t> seq_of_row(static_cast<size_t>(T));
  std::vector<RowTile> row_tiles, cmp_units, sel_units;
  const auto tile = [](int64_t n, int64_t rows, int64_t first) {
    return RowTile{static_cast<int32_t>(n), static_cast<int32_t>(rows), first};
  };
  int64_t max_len = 0;
  for (int64_t n = 0; n < layout.num_seqs(); ++n) {
    const int64_t start = layout.start(n), len = layout.length(n);
    max_len = std::max(max_len, len);
    blk_off[n + 1] = blk_off[n] + cfg.num_selection_blocks(len);
    for (int64_t t = 0; t < len; ++t) seq_of_row[start + t] = static_cast<int32_t>(n);
    const int64_t nc = cfg.num_compressed(len);
    for (int64_t i = 0; i < nc; ++i) raw_start.push_back(start + i * cfg.d);
    for (int64_t r = 0; r < len; r += kQueryTileRows) {
      row_tiles.push_back(tile(n, std::min(kQueryTileRows, len - r), r));
    }
    for (int64_t b = 0; b < len; b += cfg.l_sel) {  // selection blocks, in units of ≤ 64 rows
      const int64_t block_end = std::min(len, b + cfg.l_sel);
      for (int64_t r = b; r < block_end; r += kDkdvUnitRows) {
        sel_units.push_back(tile(n, std::min(kDkdvUnitRows, block_end - r), r));
      }
    }
    for (int64_t i = 0; i < nc; i += kDkdvUnitRows) {
      cmp_units.push_back(tile(n, std::min(kDkdvUnitRows, nc - i), i));
    }
  }
  upload(cu_seqlens_, layout.cu_seqlens);
  upload(cmp_offsets_, cmp_off);
  upload(blk_offsets_, blk_off);
  upload(cmp_raw_start_, raw_start);
  upload(seq_of_row_, seq_of_row);
  upload(row_tiles_, row_tiles);
  upload(cmp_units_, cmp_units);
  upload(sel_units_, sel_units);

  const int64_t C = cmp_off.back();
  NsaParams& p = p_;
  p.T = T, p.H = H, p.G = G, p.hpg = H / G, p.dk = cfg.dk, p.dv = cfg.dv;
  p.l = cfg.l, p.d = cfg.d, p.l_sel = cfg.l_sel, p.n_sel = cfg.n_sel, p.w = cfg.w;
  p.scale = static_cast<float>(cfg.softmax_scale());
  p.num_seqs = layout.num_seqs(), p.C = C, p.TB = blk_off.back(), p.max_len = max_len;
  p.cu_seqlens = cu_seqlens_.get(), p.cmp_offsets = cmp_offsets_.get();
  p.blk_offsets = blk_offsets_.get(), p.seq_of_row = seq_of_row_.get();
  p.cmp_raw_start = cmp_raw_start_.get();

  q_.resize(T * H * cfg.dk);
  o_.resize(T * H * cfg.dv);
  bw_->d_o.resize(T * H * cfg.dv);
  bw_->d_q.resize(T * H * cfg.dk);
  k_cmp_.resize(C * G * cfg.dk);
  v_cmp_.resize(C * G * cfg.dv);
  k_cmp_bf16_.resize(C * G * cfg.dk);
  v_cmp_bf16_.resize(C * G * cfg.dv);
  bw_->d_k_cmp.resize(C * G * cfg.dk);
  bw_->d_v_cmp.resize(C * G * cfg.dv);
  sel_idx_.resize(T * G * cfg.n_sel);
  bw_->partial.resize(dkdv_partial_floats(p));
  q_ptr_ = q_.get();
  p.q = q_ptr_, p.o = o_.get(), p.d_o = bw_->d_o.get(), p.d_q = bw_->d_q.get();
  p.k_cmp = k_cmp_.get(), p.v_cmp = v_cmp_.get(), p.d_k_cmp = bw_->d_k_cmp.get();
  p.k_cmp_bf16 = k_cmp_bf16_.get(), p.v_cmp_bf16 = v_cmp_bf16_.get();
  p.d_v_cmp = bw_->d_v_cmp.get(), p.sel_idx = sel_idx_.get();
  for (int c = 0; c < kNumBranches; ++c) {
    const int kv = cfg.kv_index(c);
    if (kv == c) {
      k_[c].resize(T * G * cfg.dk);
      v_[c].resize(T * G * cfg.dv);
      bw_->d_k[c].resize(T * G * cfg.dk);
      bw_->d_v[c].resize(T * G * cfg.dv);
    }
    gate_[c].resize(T * H);
    o_branch_[c].resize(T * H * cfg.dv);
    lse_[c].resize(T * H);
    bw_->delta[c].resize(T * H);
    bw_->d_gate[c].resize(T * H);
    p.k[c] = k_[kv].get(), p.v[c] = v_[kv].get();
    p.d_k[c] = bw_->d_k[kv].get(), p.d_v[c] = bw_->d_v[kv].get();
    p.gate[c] = gate_[c].get(), p.o_branch[c] = o_branch_[c].get(), p.lse[c] = lse_[c].get();
    p.delta[c] = bw_->delta[c].get(), p.d_gate[c] = bw_->d_gate[c].get();
  }
  if (cfg.phi == Phi::kMlp) {  // the compression MLPs' GEMMs; a handle holds device memory
    NSA_CUBLAS_CHECK(cublasCreate(&blas_));
    mlp_k_ = std::make_unique<CompressMlp>(cfg.l, cfg.dk, cfg.mlp_hidden(), C * G);
    mlp_v_ = std::make_unique<CompressMlp>(cfg.l, cfg.dv, cfg.mlp_hidden(), C * G);
    mlp_args_[0] = mlp_k_->args();
    mlp_args_[1] = mlp_v_->args();
  }
}

void NsaCudaLayer::set_selected_kernel(SelectedKernel k, int64_t partial_budget_bytes) {
  NSA_CHECK(k == SelectedKernel::kQueryMajor || cfg_.l_sel <= kSelBlockMajorMaxLsel,
            "the block-major selected kernel needs l_sel <= ", kSelBlockMajorMaxLsel,
            " (l_sel = ", cfg_.l_sel, ")");
  sel_kernel_ = k;
  bw_->sel_block_major.set_partial_budget(partial_budget_bytes);
}

NsaCudaLayer::~NsaCudaLayer() {
  if (blas_) cublasDestroy(blas_);
}

void NsaCudaLayer::set_inputs(const NsaTensors<float>& in) {
  check_inputs(cfg_, layout_, in);
  const std::vector<bf16> q = to_bf16(in.q);
  NSA_CUDA_CHECK(cudaMemcpy(q_ptr_, q.data(), q.size() * sizeof(bf16), cudaMemcpyHostToDevice));
  NSA_CUDA_CHECK(cudaStreamSynchronize(nullptr));  // complete, as DeviceBuffer::upload
  for (int c = 0; c < kNumBranches; ++c) {
    if (cfg_.kv_index(c) == c) {
      upload(k_[c], to_bf16(in.k[c]));
      upload(v_[c], to_bf16(in.v[c]));
    }
    upload(gate_[c], to_bf16(in.gate[c]));
  }
  if (mlp_k_) {  // the layer's own copies again, should set_mlp_params have pointed elsewhere
    mlp_k_->set_params(in.phi_k);
    mlp_v_->set_params(in.phi_v);
    mlp_args_[0] = mlp_k_->args();
    mlp_args_[1] = mlp_v_->args();
  }
}

void NsaCudaLayer::use_query_buffer(bf16* q) {
  NSA_CHECK(q != nullptr && reinterpret_cast<uintptr_t>(q) % 16 == 0,
            "use_query_buffer: a null or not 16-byte aligned pointer");
  q_.resize(0);
  q_ptr_ = q;
  p_.q = q;
}

void NsaCudaLayer::set_mlp_params(const float* const k[kPhiMlpTensors],
                                  const float* const v[kPhiMlpTensors]) {
  NSA_CHECK(mlp_k_, "set_mlp_params: the layer's phi is avg, not mlp");
  for (int kv = 0; kv < 2; ++kv) {
    const float* const* p = kv == 0 ? k : v;
    CompressMlpArgs& a = mlp_args_[kv];
    a.pos = p[0], a.w1 = p[1], a.b1 = p[2], a.w2 = p[3], a.b2 = p[4];
  }
}

const float* NsaCudaLayer::mlp_grad(int kv, int i) const {
  NSA_CHECK(mlp_k_ && (kv == 0 || kv == 1) && i >= 0 && i < kPhiMlpTensors, "mlp_grad(", kv, ", ",
            i, "): needs phi = mlp, kv in {0, 1}, i in [0, 5)");
  const CompressMlpArgs& a = mlp_args_[kv];
  const float* const d[kPhiMlpTensors] = {a.d_pos, a.d_w1, a.d_b1, a.d_w2, a.d_b2};
  return d[i];
}

void NsaCudaLayer::set_output_grad(const Tensor<float>& d_o) {
  check_shape(d_o, {layout_.total_tokens(), cfg_.heads, cfg_.dv}, "do");
  upload(bw_->d_o, to_bf16(d_o));
}

NsaTables NsaCudaLayer::tables() const {
  return {row_tiles_.get(),  row_tiles_.size(), sel_units_.get(),
          sel_units_.size(), cmp_units_.get(),  cmp_units_.size()};
}

NsaScratch NsaCudaLayer::scratch(bool backward) {
  NsaScratch s;
  s.sel_kernel = sel_kernel_;
  s.select_q = select_q_;
  if (fork_on_) s.fork = fork_.get();
  if (sel_kernel_ == SelectedKernel::kBlockMajor) {
    s.sel_block_major = bw_->sel_block_major.view(p_, sel_units_.size());
  }
  if (backward) {
    s.sel_index = bw_->sel_index.view(p_);
    s.partial = bw_->partial.get();
  }
  if (mlp_k_) s.mlp_k = &mlp_args_[0], s.mlp_v = &mlp_args_[1], s.blas = blas_;
  return s;
}

void NsaCudaLayer::forward(cudaStream_t stream) {
  launch_nsa_forward(p_, tables(), scratch(false), stream);
}

void NsaCudaLayer::backward(cudaStream_t stream) {
  launch_nsa_backward(cfg_, p_, tables(), scratch(true), stream);
}

void NsaCudaLayer::poison_outputs() {
  o_.poison(), k_cmp_.poison(), v_cmp_.poison(), bw_->d_q.poison(), bw_->d_k_cmp.poison();
  bw_->d_v_cmp.poison(), sel_idx_.poison(), bw_->partial.poison(), k_cmp_bf16_.poison(),
      v_cmp_bf16_.poison();
  for (int c = 0; c < kNumBranches; ++c) {
    o_branch_[c].poison(), lse_[c].poison(), bw_->delta[c].poison(), bw_->d_gate[c].poison();
    bw_->d_k[c].poison(), bw_->d_v[c].poison();
  }
  if (mlp_k_) mlp_k_->poison(), mlp_v_->poison();
}

NsaForward<float> NsaCudaLayer::download_forward() const {
  const int64_t T = layout_.total_tokens(), H = cfg_.heads, G = cfg_.groups;
  NsaForward<float> f;
  f.o = from_bf16(o_, {T, H, cfg_.dv});
  for (int c = 0; c < kNumBranches; ++c) {
    f.o_branch[c] = from_bf16(o_branch_[c], {T, H, cfg_.dv});
    f.lse[c] = from_f32(lse_[c], {T, H});
  }
  f.k_cmp = from_f32(k_cmp_, {p_.C, G, cfg_.dk});
  f.v_cmp = from_f32(v_cmp_, {p_.C, G, cfg_.dv});
  f.sel_idx = Tensor<int32_t>({T, G, cfg_.n_sel});
  const std::vector<int32_t> sel = sel_idx_.download();
  std::copy(sel.begin(), sel.end(), f.sel_idx.data.begin());
  return f;
}

NsaTensors<float> NsaCudaLayer::download_grads() const {
  const int64_t T = layout_.total_tokens(), H = cfg_.heads, G = cfg_.groups;
  NsaTensors<float> d;
  d.q = from_f32(bw_->d_q, {T, H, cfg_.dk});
  for (int c = 0; c < kNumBranches; ++c) {
    if (cfg_.kv_index(c) == c) {
      d.k[c] = from_f32(bw_->d_k[c], {T, G, cfg_.dk});
      d.v[c] = from_f32(bw_->d_v[c], {T, G, cfg_.dv});
    }
    d.gate[c] = from_f32(bw_->d_gate[c], {T, H});
  }
  if (mlp_k_) {
    d.phi_k = mlp_k_->download_grads();
    d.phi_v = mlp_v_->download_grads();
  }
  return d;
}

size_t NsaCudaLayer::device_bytes(bool without_backward_buffers) const {
  size_t total = cu_seqlens_.bytes() + cmp_offsets_.bytes() + blk_offsets_.bytes() +
                 cmp_raw_start_.bytes() + seq_of_row_.bytes() + sel_idx_.bytes() + q_.bytes() +
                 o_.bytes() + k_cmp_.bytes() + v_cmp_.bytes() + k_cmp_bf16_.bytes() +
                 v_cmp_bf16_.bytes() + row_tiles_.bytes() + cmp_units_.bytes() + sel_units_.bytes();
  for (int c = 0; c < kNumBranches; ++c) {
    total +=
        k_[c].bytes() + v_[c].bytes() + gate_[c].bytes() + o_branch_[c].bytes() + lse_[c].bytes();
  }
  if (mlp_k_) total += mlp_k_->device_bytes() + mlp_v_->device_bytes();
  return without_backward_buffers ? total : total + bw_->bytes();
}

}  // namespace nsa::cuda
