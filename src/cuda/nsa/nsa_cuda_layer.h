// NSA attention on the GPU: the validated entry point over the kernels of this folder.
//
// NsaCudaLayer owns the device buffers of one (config, layout): inputs in bf16, compressed K/V,
// outputs and saved state (o, per-branch outputs, log-sum-exps, sel_idx), and gradients in fp32.
// set_inputs/set_output_grad upload (converting to bf16), forward/backward only launch work on
// the stream (no host synchronisation inside), download_* copy results back for tests and tools.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <memory>

#include "common/device_buffer.h"
#include "compress_mlp.h"
#include "nsa/attention.h"
#include "nsa_backward_dkdv.h"
#include "nsa_launch.h"
#include "nsa_params.h"
#include "sel_block_major.h"
#include "sel_index.h"

namespace nsa::cuda {

// The buffers a backward uses only while it runs – dO, every gradient, the chunk partial sums and
// the inverted selection index. Layers of one model run their backwards one after another on one
// stream, so they can share one set (about 60 % of a layer's bytes).
struct NsaBackwardBuffers {
  DeviceBuffer<bf16> d_o;
  DeviceBuffer<float> d_q, d_k_cmp, d_v_cmp, partial, delta[3], d_gate[3], d_k[3], d_v[3];
  SelIndex sel_index;
  // Scratch of the block-major selected branch, used by forward and backward alike.
  SelBlockMajor sel_block_major;
  size_t bytes() const;
};

// The faster selected-branch kernel for a shape (measured: docs/perf.md).
SelectedKernel default_selected_kernel(const NsaConfig& cfg);

class NsaCudaLayer {
 public:
  // Throws nsa::Error without a GPU, and for head dims the kernels are not built for.
  // `backward_buffers`: shared with other layers of the same (config, layout), or null for the
  // layer's own.
  NsaCudaLayer(const NsaConfig& cfg, const SeqLayout& layout,
               std::shared_ptr<NsaBackwardBuffers> backward_buffers = nullptr);
  ~NsaCudaLayer();
  NsaCudaLayer(const NsaCudaLayer&) = delete;
  NsaCudaLayer& operator=(const NsaCudaLayer&) = delete;

  void set_inputs(const NsaTensors<float>& in);
  void set_output_grad(const Tensor<float>& d_o);  // [T, H, dv]
  void forward(cudaStream_t stream = nullptr);
  void backward(cudaStream_t stream = nullptr);  // after forward and set_output_grad

  // The selected branch's forward and dq kernels: default_selected_kernel(cfg) unless set (tests
  // and the kernel workshop compare both); tests also shrink the block-major partials' budget.
  void set_selected_kernel(SelectedKernel k, int64_t partial_budget_bytes = kSelPartialBudgetBytes);
  SelectedKernel selected_kernel() const { return sel_kernel_; }
  // Where the block selection keeps its Q rows (nsa_kernels.h; tests force each way).
  void set_select_q(SelectQ q) { select_q_ = q; }
  // Independent branches on a second stream (NsaScratch::fork; on by default; tests compare
  // both).
  void set_fork(bool on) { fork_on_ = on; }

  // Fills every output, saved-state and gradient buffer with NaN (tests: all must be overwritten).
  void poison_outputs();

  // Device-side I/O for callers whose tensors live on the GPU (the model): write the inputs and
  // dO in place (bf16, the host tensors' layouts), read o and the gradients. The φ = mlp
  // parameters come through set_inputs, or stay in the caller's device memory: set_mlp_params.
  bf16* q_in() { return q_ptr_; }
  bf16* k_in(int branch) { return k_[cfg_.kv_index(branch)].get(); }
  bf16* v_in(int branch) { return v_[cfg_.kv_index(branch)].get(); }
  bf16* gate_in(int branch) { return gate_[branch].get(); }
  bf16* d_o_in() { return bw_->d_o.get(); }
  const bf16* o_out() const { return o_.get(); }
  const int32_t* sel_idx_out() const { return sel_idx_.get(); }
  const float* d_q_out() const { return bw_->d_q.get(); }
  const float* d_k_out(int branch) const { return bw_->d_k[cfg_.kv_index(branch)].get(); }
  const float* d_v_out(int branch) const { return bw_->d_v[cfg_.kv_index(branch)].get(); }
  const float* d_gate_out(int branch) const { return bw_->d_gate[branch].get(); }
  // The queries in the caller's device memory (bf16 [T, H, dk], 16-byte aligned) instead of the
  // layer's own, which are freed: layers of a model that recompute their queries before each
  // backward share one buffer (Recompute::kOps). q_in() and set_inputs use it from then on.
  void use_query_buffer(bf16* q);
  // φ = mlp: from now on the compression MLPs read their parameters (fp32, PhiMlpParams layouts
  // and order) from the caller's device memory – k for the keys' MLP, v for the values' – instead
  // of the layer's own copies (the model keeps them in its flat weight buffer). The gradients
  // stay the layer's: mlp_grad(kv, i) (kv 0 keys, 1 values; i in PhiMlpParams order), overwritten
  // by every backward.
  void set_mlp_params(const float* const k[kPhiMlpTensors], const float* const v[kPhiMlpTensors]);
  const float* mlp_grad(int kv, int i) const;

  // The kernel workshop (bench/kernels) launches single kernels on the layer's state.
  const NsaParams& params() const { return p_; }
  NsaBackwardBuffers& backward_buffers() { return *bw_; }
  const RowTile* row_tiles() const { return row_tiles_.get(); }
  int64_t num_row_tiles() const { return row_tiles_.size(); }
  const RowTile* units(Branch b) const { return unit_table(b).get(); }
  int64_t num_units(Branch b) const { return unit_table(b).size(); }

  NsaForward<float> download_forward() const;
  NsaTensors<float> download_grads() const;
  // Every device byte the layer holds; without_backward_buffers: less the (shareable) backward set.
  size_t device_bytes(bool without_backward_buffers = false) const;

 private:
  NsaConfig cfg_;
  SeqLayout layout_;
  NsaParams p_{};
  SelectedKernel sel_kernel_;
  SelectQ select_q_ = SelectQ::kAuto;
  bool fork_on_ = true;
  std::unique_ptr<StreamFork> fork_;  // created with the layer
  DeviceBuffer<int64_t> cu_seqlens_, cmp_offsets_, blk_offsets_, cmp_raw_start_;
  DeviceBuffer<int32_t> seq_of_row_, sel_idx_;
  DeviceBuffer<bf16> q_, k_[3], v_[3], gate_[3], o_, o_branch_[3], k_cmp_bf16_, v_cmp_bf16_;
  DeviceBuffer<float> k_cmp_, v_cmp_, lse_[3];
  bf16* q_ptr_ = nullptr;  // q_, or the caller's buffer (use_query_buffer)
  std::shared_ptr<NsaBackwardBuffers> bw_;
  // 64-row query tiles (also the window's dK/dV units), compressed-token units, selection-block
  // units (see nsa_backward_dkdv.h).
  DeviceBuffer<RowTile> row_tiles_, cmp_units_, sel_units_;
  const DeviceBuffer<RowTile>& unit_table(Branch b) const {
    return b == Branch::kCmp ? cmp_units_ : b == Branch::kSel ? sel_units_ : row_tiles_;
  }
  cublasHandle_t blas_ = nullptr;
  std::unique_ptr<CompressMlp> mlp_k_, mlp_v_;  // φ = mlp only
  CompressMlpArgs mlp_args_[2];                 // their pointers (fixed after construction)
  NsaTables tables() const;
  // The scratch of one forward or backward (grows the shared buffers on first use).
  NsaScratch scratch(bool backward);
};

}  // namespace nsa::cuda
