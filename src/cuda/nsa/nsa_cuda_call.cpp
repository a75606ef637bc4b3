// NSA forward / backward on caller-owned device memory (see nsa_cuda_call.h). One function lays the
// call out – sizes, the caller's pointers, the scratch carved from the workspace – so that the
// workspace size reported beforehand (a counting pass over a null workspace) and the layout of the
// real call are the same code.
#include "nsa_cuda_call.h"

#include <cublas_v2.h>

#include <array>
#include <atomic>
#include <unordered_map>

#include "common/cublas_check.h"
#include "common/cuda_check.h"
#include "common/workspace.h"
#include "compress_mlp.h"
#include "device.h"
#include "device_layout.h"
#include "head_dims.h"
#include "nsa_cuda_layer.h"
#include "nsa_launch.h"

namespace nsa::cuda {
namespace {

// Everything one call launches with. Not copyable: scratch points at its own mlp args.
struct Call {
  NsaParams p{};
  DeviceLayout layout;
  NsaTables tables;
  NsaScratch scratch;
  CompressMlpArgs mlp[2];
  Call() = default;
  Call(const Call&) = delete;
  Call& operator=(const Call&) = delete;
};

CompressMlpArgs mlp_args(const NsaConfig& cfg, int64_t D, int64_t rows, const float* const* params,
                         float* const* grads) {
  CompressMlpArgs a;
  a.l = cfg.l, a.D = D, a.hidden = cfg.mlp_hidden(), a.rows = rows;
  a.pos = params[0], a.w1 = params[1], a.b1 = params[2], a.w2 = params[3], a.b2 = params[4];
  a.d_pos = grads[0], a.d_w1 = grads[1], a.d_b1 = grads[2], a.d_w2 = grads[3], a.d_b2 = grads[4];
  return a;
}

// Fills c for a call of T tokens in N sequences, taking the scratch from ws (a counting workspace
// gives null scratch pointers and counts the bytes).
void lay_out(Call& c, const NsaConfig& cfg, int64_t T, int64_t N, const NsaCudaIo& io,
             bool backward, Workspace& ws) {
  NsaParams& p = c.p;
  p.T = T, p.H = cfg.heads, p.G = cfg.groups, p.hpg = cfg.heads_per_group();
  p.dk = cfg.dk, p.dv = cfg.dv, p.l = cfg.l, p.d = cfg.d, p.l_sel = cfg.l_sel;
  p.n_sel = cfg.n_sel, p.w = cfg.w, p.scale = static_cast<float>(cfg.softmax_scale());
  c.layout = carve_device_layout(cfg, T, N, ws);
  attach_device_layout(p, c.layout);
  const int64_t C = p.C, G = p.G, H = p.H;

  p.q = io.q, p.o = io.o, p.sel_idx = io.sel_idx, p.k_cmp = io.k_cmp, p.v_cmp = io.v_cmp;
  for (int b = 0; b < kNumBranches; ++b) {
    const int kv = cfg.kv_index(b);
    p.k[b] = io.k[kv], p.v[b] = io.v[kv], p.gate[b] = io.gate[b];
    p.o_branch[b] = io.o_branch[b], p.lse[b] = io.lse[b];
  }
  p.k_cmp_bf16 = ws.take<bf16>(C * G * cfg.dk);
  p.v_cmp_bf16 = ws.take<bf16>(C * G * cfg.dv);

  const layout::Capacities& caps = c.layout.caps;
  c.tables = {c.layout.row_tiles, caps.row_tiles,     c.layout.sel_units,
              caps.sel_units,     c.layout.cmp_units, caps.cmp_units};
  NsaScratch& s = c.scratch;
  s.sel_kernel = default_selected_kernel(cfg);
  if (s.sel_kernel == SelectedKernel::kBlockMajor) {
    const int64_t budget =
        io.sel_partial_budget_bytes > 0 ? io.sel_partial_budget_bytes : kSelPartialBudgetBytes;
    s.sel_block_major = carve_sel_block_major(p, budget, caps.sel_units, ws);
  }
  s.device_layout = &c.layout;
  if (backward) {
    p.d_o = io.d_o, p.d_q = io.d_q;
    float* d_k[3] = {io.d_k[0], io.d_k[1], io.d_k[2]};
    float* d_v[3] = {io.d_v[0], io.d_v[1], io.d_v[2]};
    if (io.grads_bf16) {  // the fp32 sums in the workspace; the kernels' bf16 outputs the caller's
      p.d_q = ws.take<float>(T * H * cfg.dk), p.d_q_bf16 = io.d_q_bf16;
      for (int b = 0; b < kNumBranches; ++b) {
        if (cfg.kv_index(b) != b) continue;
        d_k[b] = ws.take<float>(T * G * cfg.dk), d_v[b] = ws.take<float>(T * G * cfg.dv);
      }
    }
    for (int b = 0; b < kNumBranches; ++b) {
      const int kv = cfg.kv_index(b);
      p.d_k[b] = d_k[kv], p.d_v[b] = d_v[kv];
      // One copy per gradient buffer: shared K/V's (index 0) after its last writer.
      p.d_k_bf16[b] = kv == b ? io.d_k_bf16[b] : nullptr;
      p.d_v_bf16[b] = kv == b ? io.d_v_bf16[b] : nullptr;
      p.d_gate[b] = io.grads_bf16 ? nullptr : io.d_gate[b];
      p.d_gate_bf16[b] = io.grads_bf16 ? io.d_gate_bf16[b] : nullptr;
      p.delta[b] = ws.take<float>(T * H);
    }
    p.d_k_cmp = ws.take<float>(C * G * cfg.dk);
    p.d_v_cmp = ws.take<float>(C * G * cfg.dv);
    s.partial = ws.take<float>(dkdv_partial_floats(p));
    s.sel_index = carve_sel_index(p, ws);
  }
  if (cfg.phi == Phi::kMlp) {
    c.mlp[0] = mlp_args(cfg, cfg.dk, C * G, io.phi_k, io.d_phi_k);
    c.mlp[1] = mlp_args(cfg, cfg.dv, C * G, io.phi_v, io.d_phi_v);
    void* blas_workspace = ws.take_bytes(kCublasWorkspaceBytes);
    for (CompressMlpArgs& a : c.mlp) {
      carve_compress_mlp_activations(a, backward, ws);
      a.blas_workspace = blas_workspace, a.blas_workspace_bytes = kCublasWorkspaceBytes;
    }
    s.mlp_k = &c.mlp[0], s.mlp_v = &c.mlp[1];
  }
}

// One cuBLAS handle per (thread, device), created on first use – before a CUDA graph capture,
// since creating one allocates. The handles live as long as the process (a thread's handles are
// not destroyed at its exit: the CUDA context may already be gone then).
cublasHandle_t blas_handle() {
  thread_local std::unordered_map<int, cublasHandle_t>* handles =
      new std::unordered_map<int, cublasHandle_t>();
  int device = 0;
  NSA_CUDA_CHECK(cudaGetDevice(&device));
  auto it = handles->find(device);
  if (it == handles->end()) {
    cublasHandle_t h = nullptr;
    NSA_CUBLAS_CHECK(cublasCreate(&h));
    it = handles->emplace(device, h).first;
  }
  return it->second;
}

// The side stream of the forward and backward (NsaScratch::fork), likewise one per (thread,
// device), made on first use; calls on other streams of the thread share it (their side work then
// runs in call order).
const StreamFork* stream_fork() {
  thread_local std::unordered_map<int, StreamFork*>* forks =
      new std::unordered_map<int, StreamFork*>();
  int device = 0;
  NSA_CUDA_CHECK(cudaGetDevice(&device));
  auto it = forks->find(device);
  if (it == forks->end()) it = forks->emplace(device, new StreamFork()).first;
  return it->second;
}

}  // namespace

int64_t nsa_cuda_compressed_rows(const NsaConfig& cfg, int64_t T, int64_t N) {
  return layout::capacities({cfg.l, cfg.d, cfg.l_sel}, T, N).cmp;
}

void nsa_cuda_check_supported(const NsaConfig& cfg) {
  NSA_CHECK(head_dims_supported(cfg.dk, cfg.dv), "CUDA NSA attention: head dims (dk, dv) = (",
            cfg.dk, ", ", cfg.dv,
            ") are not built for the CUDA kernels; supported: ", supported_head_dims());
  NSA_CHECK(device_count() > 0, "CUDA NSA attention: no usable CUDA device (no GPU or no driver)");
  int device = 0;
  NSA_CUDA_CHECK(cudaGetDevice(&device));
  // Compute capability per device (major·10 + minor; 0 = not read yet), read once.
  static std::array<std::atomic<int>, 64> known{};
  int cc = device < static_cast<int>(known.size()) ? known[device].load() : 0;
  if (cc == 0) {
    int major = 0, minor = 0;
    NSA_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
    NSA_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
    cc = major * 10 + minor;
    if (device < static_cast<int>(known.size())) known[device].store(cc);
  }
  NSA_CHECK(cc == 90, "CUDA NSA attention: device ", device, " has compute capability ", cc / 10,
            ".", cc % 10, "; the kernels are built for Hopper (sm_90a) only");
}

size_t nsa_cuda_workspace_bytes(const NsaConfig& cfg, int64_t T, int64_t N, bool backward,
                                bool grads_bf16) {
  cfg.validate();
  Workspace ws = Workspace::sizing();
  Call c;
  NsaCudaIo io;
  io.grads_bf16 = backward && grads_bf16;
  lay_out(c, cfg, T, N, io, backward, ws);
  return ws.used();
}

// What both entry points do first: the config checked, the call laid out in the workspace (which
// must be there if the call needs any), φ's cuBLAS handle taken.
void begin_call(Call& c, const NsaConfig& cfg, int64_t T, int64_t N, const NsaCudaIo& io,
                bool backward, void* workspace, size_t workspace_bytes) {
  cfg.validate();
  nsa_cuda_check_supported(cfg);
  Workspace ws(workspace, workspace_bytes);
  lay_out(c, cfg, T, N, io, backward, ws);
  NSA_CHECK(workspace || ws.used() == 0, "CUDA NSA attention: the workspace is NULL");
  if (cfg.phi == Phi::kMlp) c.scratch.blas = blas_handle();
}

void nsa_cuda_forward(const NsaConfig& cfg, int64_t T, int64_t N, const int64_t* cu_seqlens,
                      const NsaCudaIo& io, void* workspace, size_t workspace_bytes,
                      cudaStream_t stream) {
  Call c;
  begin_call(c, cfg, T, N, io, false, workspace, workspace_bytes);
  if (T == 0) return;
  c.scratch.fork = stream_fork();
  launch_build_device_layout(cfg, c.layout, cu_seqlens, stream);
  launch_nsa_forward(c.p, c.tables, c.scratch, stream);
}

void nsa_cuda_backward(const NsaConfig& cfg, int64_t T, int64_t N, const int64_t* cu_seqlens,
                       const NsaCudaIo& io, void* workspace, size_t workspace_bytes,
                       cudaStream_t stream) {
  Call c;
  begin_call(c, cfg, T, N, io, true, workspace, workspace_bytes);
  if (T == 0) {  // nothing to attend to: only the φ parameters have (zero) gradients
    if (cfg.phi == Phi::kMlp) {
      for (const CompressMlpArgs& a : c.mlp) {
        compress_mlp_backward(c.scratch.blas, c.p, a, nullptr, nullptr, false, stream);
      }
    }
    return;
  }
  c.scratch.fork = stream_fork();
  launch_build_device_layout(cfg, c.layout, cu_seqlens, stream);
  launch_nsa_backward_recompute(c.p, c.scratch, stream);
  launch_nsa_backward(cfg, c.p, c.tables, c.scratch, stream);  // bf16 gradients included
}

}  // namespace nsa::cuda
