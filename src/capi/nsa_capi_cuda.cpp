// The C ABI's CUDA entry points (see nsa_capi.h) over nsa::cuda::nsa_cuda_forward / _backward:
// every tensor's shape is checked against the config and its pointer's alignment against the
// kernels' vector loads (the device memory itself is never touched here), then one call enqueues
// the work on the caller's stream.
#include <cuda_runtime.h>

#include <array>
#include <cstdint>
#include <string>

#include "capi_common.h"
#include "cuda/common/cuda_check.h"
#include "cuda/device.h"
#include "cuda/nsa/nsa_cuda_call.h"

namespace nsa {
namespace {

using cuda::bf16;

// The device pointer of a present tensor of shape `expected`, 16-byte aligned (NULL allowed when
// the shape has no elements, as an empty PyTorch tensor's is).
template <typename T>
T* device_tensor(const NsaTensorRef& r, const Shape& expected, const std::string& name) {
  NSA_CHECK(r.data || (r.ndim > 0 && shape_numel(expected) == 0), "tensor '", name, "' is missing");
  const Shape got = capi::ref_shape(r, name);
  NSA_CHECK(got == expected, "tensor '", name, "' has shape ", shape_str(got), ", expected ",
            shape_str(expected));
  NSA_CHECK(reinterpret_cast<uintptr_t>(r.data) % 16 == 0, "tensor '", name,
            "' is not 16-byte aligned (the kernels' vector loads need it): pass a fresh copy");
  return static_cast<T*>(r.data);
}

// pos [l, D], w1 [l·D, Hd], b1 [Hd], w2 [Hd, D], b2 [D].
std::array<Shape, 5> phi_shapes(const NsaConfig& cfg, int64_t D) {
  const int64_t hid = cfg.mlp_hidden();
  return {Shape{cfg.l, D}, Shape{cfg.l * D, hid}, Shape{hid}, Shape{hid, D}, Shape{D}};
}

// Fills io from the C structs: inputs always, the forward's outputs (o only when `with_o`), and the
// backward's dO and gradients when given (those of q, k, v and the gates in bf16 with
// grads_bf16).
void read_io(const NsaConfig& cfg, int64_t T, int64_t N, const NsaAttnTensors& in,
             const NsaAttnSaved& saved, bool with_o, const NsaTensorRef* d_o,
             const NsaAttnTensors* grads, bool grads_bf16, cuda::NsaCudaIo& io) {
  const int64_t H = cfg.heads, G = cfg.groups, dk = cfg.dk, dv = cfg.dv;
  const int64_t C = cuda::nsa_cuda_compressed_rows(cfg, T, N);
  const auto gname = [](int c) { return std::string("g_") + kBranchNames[c]; };
  io.q = device_tensor<const bf16>(in.q, {T, H, dk}, "q");
  for (int c = 0; c < kNumBranches; ++c) {
    if (cfg.kv_index(c) == c) {
      io.k[c] = device_tensor<const bf16>(in.k[c], {T, G, dk}, capi::branch_name("k", c, cfg));
      io.v[c] = device_tensor<const bf16>(in.v[c], {T, G, dv}, capi::branch_name("v", c, cfg));
    }
    io.gate[c] = device_tensor<const bf16>(in.g[c], {T, H}, gname(c));
  }
  const bool mlp = cfg.phi == Phi::kMlp;
  for (int i = 0; mlp && i < 5; ++i) {
    const std::string f = capi::kPhiNames[i];
    io.phi_k[i] = device_tensor<const float>(in.phi_k[i], phi_shapes(cfg, dk)[i], "phi_k_" + f);
    io.phi_v[i] = device_tensor<const float>(in.phi_v[i], phi_shapes(cfg, dv)[i], "phi_v_" + f);
  }

  if (with_o) io.o = device_tensor<bf16>(saved.o, {T, H, dv}, "o");
  for (int c = 0; c < kNumBranches; ++c) {
    const std::string name = kBranchNames[c];
    io.o_branch[c] = device_tensor<bf16>(saved.o_branch[c], {T, H, dv}, "o_" + name);
    io.lse[c] = device_tensor<float>(saved.lse[c], {T, H}, "lse_" + name);
  }
  io.k_cmp = device_tensor<float>(saved.k_cmp, {C, G, dk}, "k_cmp (compressed)");
  io.v_cmp = device_tensor<float>(saved.v_cmp, {C, G, dv}, "v_cmp (compressed)");
  io.sel_idx = device_tensor<int32_t>(saved.sel_idx, {T, G, cfg.n_sel}, "sel_idx");

  if (!grads) return;
  io.d_o = device_tensor<const bf16>(*d_o, {T, H, dv}, "do");
  io.grads_bf16 = grads_bf16;
  if (grads_bf16) {
    io.d_q_bf16 = device_tensor<bf16>(grads->q, {T, H, dk}, "dq");
  } else {
    io.d_q = device_tensor<float>(grads->q, {T, H, dk}, "dq");
  }
  for (int c = 0; c < kNumBranches; ++c) {
    const std::string dg = "d" + gname(c);
    if (cfg.kv_index(c) == c) {
      const std::string dk_name = "d" + capi::branch_name("k", c, cfg);
      const std::string dv_name = "d" + capi::branch_name("v", c, cfg);
      if (grads_bf16) {
        io.d_k_bf16[c] = device_tensor<bf16>(grads->k[c], {T, G, dk}, dk_name);
        io.d_v_bf16[c] = device_tensor<bf16>(grads->v[c], {T, G, dv}, dv_name);
      } else {
        io.d_k[c] = device_tensor<float>(grads->k[c], {T, G, dk}, dk_name);
        io.d_v[c] = device_tensor<float>(grads->v[c], {T, G, dv}, dv_name);
      }
    }
    if (grads_bf16) {
      io.d_gate_bf16[c] = device_tensor<bf16>(grads->g[c], {T, H}, dg);
    } else {
      io.d_gate[c] = device_tensor<float>(grads->g[c], {T, H}, dg);
    }
  }
  for (int i = 0; mlp && i < 5; ++i) {
    const std::string f = capi::kPhiNames[i];
    io.d_phi_k[i] = device_tensor<float>(grads->phi_k[i], phi_shapes(cfg, dk)[i], "dphi_k_" + f);
    io.d_phi_v[i] = device_tensor<float>(grads->phi_v[i], phi_shapes(cfg, dv)[i], "dphi_v_" + f);
  }
}

// Makes `device` current on this thread for the guard's lifetime (cudaSetDevice only when it is
// not already: nothing is enqueued, so this is allowed during a graph capture).
class DeviceGuard {
 public:
  explicit DeviceGuard(int32_t device) {
    const int n = cuda::device_count();
    NSA_CHECK(device >= 0 && device < n, "device = ", device, " is not a usable CUDA device (", n,
              " present)");
    NSA_CUDA_CHECK(cudaGetDevice(&previous_));
    if (previous_ != device) NSA_CUDA_CHECK(cudaSetDevice(device));
  }
  ~DeviceGuard() {
    int now = previous_;
    if (cudaGetDevice(&now) == cudaSuccess && now != previous_) cudaSetDevice(previous_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = 0;
};

void check_layout(const int64_t* cu_seqlens, int64_t num_seqs, int64_t T) {
  NSA_CHECK(num_seqs >= 1, "num_seqs = ", num_seqs, " must be at least 1");
  NSA_CHECK(cu_seqlens || T % num_seqs == 0, "without cu_seqlens the ", T,
            " tokens must split into num_seqs = ", num_seqs, " sequences of equal length");
  NSA_CHECK(reinterpret_cast<uintptr_t>(cu_seqlens) % 8 == 0, "cu_seqlens is not 8-byte aligned");
}

// Both backward entry points: fp32 gradients, or (grads_bf16) bf16 ones for q, k, v and the gates.
void backward_cuda(const NsaAttnConfig* cfg, const int64_t* cu_seqlens, int64_t num_seqs,
                   const NsaAttnTensors* in, const NsaAttnSaved* saved, const NsaTensorRef* d_o,
                   const NsaAttnTensors* grads, bool grads_bf16, void* workspace,
                   size_t workspace_bytes, int32_t device, void* stream) {
  const NsaConfig c = capi::make_config(cfg);
  const int64_t T = capi::tokens_of(in);
  NSA_CHECK(saved && d_o && grads, "saved tensors, do or gradients are NULL");
  check_layout(cu_seqlens, num_seqs, T);
  cuda::NsaCudaIo io;
  read_io(c, T, num_seqs, *in, *saved, false, d_o, grads, grads_bf16, io);
  const DeviceGuard guard(device);
  cuda::nsa_cuda_backward(c, T, num_seqs, cu_seqlens, io, workspace, workspace_bytes,
                          static_cast<cudaStream_t>(stream));
}

}  // namespace
}  // namespace nsa

extern "C" {

int32_t nsa_cuda_available(char* err, size_t err_size) {
  if (nsa::cuda::device_count() == 0) {
    return nsa::capi::unavailable("no usable CUDA device (no GPU or no driver)", err, err_size);
  }
  return NSA_OK;
}

int32_t nsa_cuda_compressed_rows(const NsaAttnConfig* cfg, int64_t total_tokens, int64_t num_seqs,
                                 int64_t* out, char* err, size_t err_size) {
  return nsa::capi::guarded(err, err_size, [&] {
    NSA_CHECK(out && total_tokens >= 0 && num_seqs >= 1, "bad arguments");
    *out = nsa::cuda::nsa_cuda_compressed_rows(nsa::capi::make_config(cfg), total_tokens, num_seqs);
  });
}

int32_t nsa_cuda_workspace_bytes(const NsaAttnConfig* cfg, int64_t total_tokens, int64_t num_seqs,
                                 int32_t backward, int32_t device, size_t* out, char* err,
                                 size_t err_size) {
  return nsa::capi::guarded(err, err_size, [&] {
    NSA_CHECK(out && total_tokens >= 0 && num_seqs >= 1, "bad arguments");
    NSA_CHECK(backward >= 0 && backward <= 2, "backward = ", backward,
              ": 0 (forward), 1 (backward) or 2 (backward with bf16 gradients)");
    const nsa::DeviceGuard guard(device);
    *out = nsa::cuda::nsa_cuda_workspace_bytes(nsa::capi::make_config(cfg), total_tokens, num_seqs,
                                               backward != 0, backward == 2);
  });
}

int32_t nsa_attention_forward_cuda(const NsaAttnConfig* cfg, const int64_t* cu_seqlens,
                                   int64_t num_seqs, const NsaAttnTensors* in,
                                   const NsaAttnSaved* out, void* workspace, size_t workspace_bytes,
                                   int32_t device, void* stream, char* err, size_t err_size) {
  return nsa::capi::guarded(err, err_size, [&] {
    const nsa::NsaConfig c = nsa::capi::make_config(cfg);
    const int64_t T = nsa::capi::tokens_of(in);
    NSA_CHECK(out, "outputs are NULL");
    nsa::check_layout(cu_seqlens, num_seqs, T);
    nsa::cuda::NsaCudaIo io;
    nsa::read_io(c, T, num_seqs, *in, *out, true, nullptr, nullptr, false, io);
    const nsa::DeviceGuard guard(device);
    nsa::cuda::nsa_cuda_forward(c, T, num_seqs, cu_seqlens, io, workspace, workspace_bytes,
                                static_cast<cudaStream_t>(stream));
  });
}

int32_t nsa_attention_backward_cuda(const NsaAttnConfig* cfg, const int64_t* cu_seqlens,
                                    int64_t num_seqs, const NsaAttnTensors* in,
                                    const NsaAttnSaved* saved, const NsaTensorRef* d_o,
                                    const NsaAttnTensors* grads, void* workspace,
                                    size_t workspace_bytes, int32_t device, void* stream, char* err,
                                    size_t err_size) {
  return nsa::capi::guarded(err, err_size, [&] {
    nsa::backward_cuda(cfg, cu_seqlens, num_seqs, in, saved, d_o, grads, false, workspace,
                       workspace_bytes, device, stream);
  });
}

int32_t nsa_attention_backward_cuda_bf16(const NsaAttnConfig* cfg, const int64_t* cu_seqlens,
                                         int64_t num_seqs, const NsaAttnTensors* in,
                                         const NsaAttnSaved* saved, const NsaTensorRef* d_o,
                                         const NsaAttnTensors* grads, void* workspace,
                                         size_t workspace_bytes, int32_t device, void* stream,
                                         char* err, size_t err_size) {
  return nsa::capi::guarded(err, err_size, [&] {
    nsa::backward_cuda(cfg, cu_seqlens, num_seqs, in, saved, d_o, grads, true, workspace,
                       workspace_bytes, device, stream);
  });
}

}  // extern "C"
