// The stateless CUDA path (cuda/nsa/nsa_cuda_call.h: what the C ABI's CUDA entry points and
// PyTorch run) against NsaCudaLayer on the same inputs. Both launch the same kernels in the same
// order (nsa_launch.h); the call builds its layout tables on the device into padded tables, sizes
// the compressed K/V by a capacity, carves its scratch from one workspace and recomputes the bf16
// compressed K/V in the backward. With φ = avg every output and gradient must therefore be
// bit-identical to the layer's (tested against the CPU reference in test_nsa_cuda.cpp); φ = mlp
// runs cuBLAS on more rows (the capacity), so there the compressed K/V are compared to rounding.
// Also: a cu_seqlens out of order is clamped into a valid layout, and a forward + backward
// captures into a CUDA graph whose replay repeats the direct results bit for bit.
#include <gtest/gtest.h>

#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "../common/test_util.h"
#include "cuda/common/cuda_check.h"
#include "cuda/common/device_buffer.h"
#include "cuda/nsa/nsa_cuda_call.h"
#include "cuda/nsa/nsa_cuda_layer.h"
#include "cuda/nsa/sel_block_major.h"

namespace nsa::test {
namespace {

using cuda::bf16;
using cuda::DeviceBuffer;

void round_bf16(Tensor<float>& t) {
  for (float& x : t.data) x = __bfloat162float(__float2bfloat16(x));
}

NsaTensors<float> bf16_inputs(const NsaConfig& cfg, int64_t T, uint64_t seed) {
  NsaTensors<float> in = random_nsa_inputs<float>(cfg, T, seed);
  round_bf16(in.q);
  for (int c = 0; c < kNumBranches; ++c)
    round_bf16(in.k[c]), round_bf16(in.v[c]), round_bf16(in.gate[c]);
  return in;
}

void upload_bf16(DeviceBuffer<bf16>& dst, const Tensor<float>& t) {
  std::vector<bf16> h(t.data.size());
  for (size_t i = 0; i < h.size(); ++i) h[i] = __float2bfloat16(t.data[i]);
  dst.upload(h.data(), static_cast<int64_t>(h.size()));
}

Tensor<float> download_bf16(const DeviceBuffer<bf16>& b, Shape shape) {
  const std::vector<bf16> h = b.download();
  Tensor<float> t(std::move(shape));
  for (size_t i = 0; i < h.size(); ++i) t.data[i] = __bfloat162float(h[i]);
  return t;
}

template <typename T>
Tensor<T> download(const DeviceBuffer<T>& b, Shape shape) {
  const std::vector<T> h = b.download();
  Tensor<T> t(std::move(shape));
  std::copy(h.begin(), h.end(), t.data.begin());
  return t;
}

// A gradient buffer of either precision as floats.
Tensor<float> as_floats(const DeviceBuffer<float>& b, Shape shape) {
  return download(b, std::move(shape));
}
Tensor<float> as_floats(const DeviceBuffer<bf16>& b, Shape shape) {
  return download_bf16(b, std::move(shape));
}

// The caller's device memory of one call: inputs, outputs, gradients, workspaces.
struct CallBuffers {
  DeviceBuffer<bf16> q, k[3], v[3], g[3], d_o, o, o_br[3];
  DeviceBuffer<float> phi_k[5], phi_v[5], lse[3], k_cmp, v_cmp, d_q, d_k[3], d_v[3], d_g[3];
  DeviceBuffer<float> d_phi_k[5], d_phi_v[5];
  DeviceBuffer<int32_t> sel;
  DeviceBuffer<int64_t> cu;
  DeviceBuffer<unsigned char> ws_fwd, ws_bwd;
  cuda::NsaCudaIo io;
  int64_t T = 0, N = 0, C = 0;

  CallBuffers(const NsaConfig& cfg, const NsaTensors<float>& in, const Tensor<float>& dout,
              const std::vector<int64_t>* cu_seqlens, int64_t num_seqs) {
    T = in.q.shape[0], N = num_seqs, C = cuda::nsa_cuda_compressed_rows(cfg, T, N);
    const int64_t H = cfg.heads, G = cfg.groups, dk = cfg.dk, dv = cfg.dv;
    upload_bf16(q, in.q), io.q = q.get();
    upload_bf16(d_o, dout), io.d_o = d_o.get();
    d_q.resize(T * H * dk), io.d_q = d_q.get();
    o.resize(T * H * dv), io.o = o.get();
    for (int c = 0; c < kNumBranches; ++c) {
      if (cfg.kv_index(c) == c) {
        upload_bf16(k[c], in.k[c]), upload_bf16(v[c], in.v[c]);
        io.k[c] = k[c].get(), io.v[c] = v[c].get();
        d_k[c].resize(T * G * dk), d_v[c].resize(T * G * dv);
        io.d_k[c] = d_k[c].get(), io.d_v[c] = d_v[c].get();
      }
      upload_bf16(g[c], in.gate[c]), io.gate[c] = g[c].get();
      o_br[c].resize(T * H * dv), io.o_branch[c] = o_br[c].get();
      lse[c].resize(T * H), io.lse[c] = lse[c].get();
      d_g[c].resize(T * H), io.d_gate[c] = d_g[c].get();
    }
    k_cmp.resize(C * G * dk), v_cmp.resize(C * G * dv), sel.resize(T * G * cfg.n_sel);
    io.k_cmp = k_cmp.get(), io.v_cmp = v_cmp.get(), io.sel_idx = sel.get();
    if (cfg.phi == Phi::kMlp) {
      const PhiMlpParams<float>* params[2] = {&in.phi_k, &in.phi_v};
      for (int m = 0; m < 2; ++m) {
        const Tensor<float>* f[5] = {&params[m]->pos, &params[m]->w1, &params[m]->b1,
                                     &params[m]->w2, &params[m]->b2};
        DeviceBuffer<float>* p = m ? phi_v : phi_k;
        DeviceBuffer<float>* dp = m ? d_phi_v : d_phi_k;
        for (int i = 0; i < 5; ++i) {
          p[i].upload(f[i]->ptr(), f[i]->numel());
          dp[i].resize(f[i]->numel());
          (m ? io.phi_v : io.phi_k)[i] = p[i].get();
          (m ? io.d_phi_v : io.d_phi_k)[i] = dp[i].get();
        }
      }
    }
    if (cu_seqlens) cu.upload(cu_seqlens->data(), static_cast<int64_t>(cu_seqlens->size()));
    ws_fwd.resize(static_cast<int64_t>(cuda::nsa_cuda_workspace_bytes(cfg, T, N, false)));
    ws_bwd.resize(static_cast<int64_t>(cuda::nsa_cuda_workspace_bytes(cfg, T, N, true)));
  }

  void poison() {
    o.poison(), k_cmp.poison(), v_cmp.poison(), d_q.poison(), sel.poison();
    for (int c = 0; c < kNumBranches; ++c) {
      o_br[c].poison(), lse[c].poison(), d_k[c].poison(), d_v[c].poison(), d_g[c].poison();
    }
    for (int i = 0; i < 5; ++i) d_phi_k[i].poison(), d_phi_v[i].poison();
    NSA_CUDA_CHECK(cudaDeviceSynchronize());
  }

  void run(const NsaConfig& cfg, cudaStream_t stream) {
    const int64_t* cu_ptr = cu.size() ? cu.get() : nullptr;
    cuda::nsa_cuda_forward(cfg, T, N, cu_ptr, io, ws_fwd.get(), ws_fwd.bytes(), stream);
    cuda::nsa_cuda_backward(cfg, T, N, cu_ptr, io, ws_bwd.get(), ws_bwd.bytes(), stream);
  }

  NsaForward<float> forward(const NsaConfig& cfg) const {
    const int64_t H = cfg.heads, G = cfg.groups;
    NsaForward<float> f;
    f.o = download_bf16(o, {T, H, cfg.dv});
    for (int c = 0; c < kNumBranches; ++c) {
      f.o_branch[c] = download_bf16(o_br[c], {T, H, cfg.dv});
      f.lse[c] = download(lse[c], {T, H});
    }
    f.k_cmp = download(k_cmp, {C, G, cfg.dk});
    f.v_cmp = download(v_cmp, {C, G, cfg.dv});
    f.sel_idx = download(sel, {T, G, cfg.n_sel});
    return f;
  }

  // The gradients in dq, dk[3], dv[3], dg[3] (fp32 or bf16), downloaded as floats.
  template <typename E>
  NsaTensors<float> grads_in(const NsaConfig& cfg, const DeviceBuffer<E>& dq,
                             const DeviceBuffer<E>* dk, const DeviceBuffer<E>* dv,
                             const DeviceBuffer<E>* dg) const {
    const int64_t H = cfg.heads, G = cfg.groups;
    NsaTensors<float> d;
    d.q = as_floats(dq, {T, H, cfg.dk});
    for (int c = 0; c < kNumBranches; ++c) {
      if (cfg.kv_index(c) == c) {
        d.k[c] = as_floats(dk[c], {T, G, cfg.dk});
        d.v[c] = as_floats(dv[c], {T, G, cfg.dv});
      }
      d.gate[c] = as_floats(dg[c], {T, H});
    }
    return d;
  }
  NsaTensors<float> grads(const NsaConfig& cfg) const { return grads_in(cfg, d_q, d_k, d_v, d_g); }

  // The backward again with bf16 gradients (NsaCudaIo::grads_bf16) into poisoned buffers of its
  // own: q, k, v and the gates' gradients, downloaded as floats.
  NsaTensors<float> grads_bf16(const NsaConfig& cfg, cudaStream_t stream) {
    const int64_t H = cfg.heads, G = cfg.groups;
    DeviceBuffer<bf16> dq(T * H * cfg.dk), dk[3], dv[3], dg[3];
    DeviceBuffer<unsigned char> ws(
        static_cast<int64_t>(cuda::nsa_cuda_workspace_bytes(cfg, T, N, true, true)));
    cuda::NsaCudaIo b = io;
    b.grads_bf16 = true;
    b.d_q = nullptr, b.d_q_bf16 = dq.get();
    dq.poison();
    for (int c = 0; c < kNumBranches; ++c) {
      b.d_k[c] = b.d_v[c] = b.d_gate[c] = nullptr;
      if (cfg.kv_index(c) == c) {
        dk[c].resize(T * G * cfg.dk), dv[c].resize(T * G * cfg.dv);
        dk[c].poison(), dv[c].poison();
        b.d_k_bf16[c] = dk[c].get(), b.d_v_bf16[c] = dv[c].get();
      }
      dg[c].resize(T * H), dg[c].poison(), b.d_gate_bf16[c] = dg[c].get();
    }
    NSA_CUDA_CHECK(cudaDeviceSynchronize());
    cuda::nsa_cuda_backward(cfg, T, N, cu.size() ? cu.get() : nullptr, b, ws.get(), ws.bytes(),
                            stream);
    NSA_CUDA_CHECK(cudaStreamSynchronize(stream));
    return grads_in(cfg, dq, dk, dv, dg);
  }
};

// The first `rows` rows of a compressed K/V buffer; the rest must be zero (padding).
Tensor<float> real_rows(const Tensor<float>& t, int64_t rows, const std::string& what) {
  const int64_t per_row = t.shape[1] * t.shape[2];
  for (int64_t i = rows * per_row; i < t.numel(); ++i) {
    EXPECT_EQ(t[i], 0.0f) << what << ": padding row " << i / per_row << " is not zero";
  }
  Tensor<float> out({rows, t.shape[1], t.shape[2]});
  std::copy(t.data.begin(), t.data.begin() + rows * per_row, out.data.begin());
  return out;
}

void expect_same_as_layer(const NsaConfig& cfg, const SeqLayout& layout, const CallBuffers& call,
                          cuda::NsaCudaLayer& layer) {
  const NsaForward<float> want = layer.download_forward(), got = call.forward(cfg);
  const int64_t C = layout.compressed_offsets(cfg).back();
  expect_equal(got.o, want.o, "o");
  for (int c = 0; c < kNumBranches; ++c) {
    expect_equal(got.o_branch[c], want.o_branch[c], std::string("o_") + kBranchNames[c]);
    expect_equal(got.lse[c], want.lse[c], std::string("lse_") + kBranchNames[c]);
  }
  expect_equal(real_rows(got.k_cmp, C, "k_cmp"), want.k_cmp, "k_cmp");
  expect_equal(real_rows(got.v_cmp, C, "v_cmp"), want.v_cmp, "v_cmp");
  expect_equal(got.sel_idx, want.sel_idx, "sel_idx");
  const NsaTensors<float> gw = layer.download_grads(), gg = call.grads(cfg);
  expect_equal(gg.q, gw.q, "dq");
  for (int c = 0; c < kNumBranches; ++c) {
    if (cfg.kv_index(c) == c) {
      expect_equal(gg.k[c], gw.k[c], std::string("dk_") + kBranchNames[c]);
      expect_equal(gg.v[c], gw.v[c], std::string("dv_") + kBranchNames[c]);
    }
    expect_equal(gg.gate[c], gw.gate[c], std::string("dg_") + kBranchNames[c]);
  }
}

struct CallCase {
  const char* name;
  Shape5 shape;
  Hyper hyper;
  KvMode kv;
  std::vector<int64_t> cu_seqlens;
  bool pass_cu;  // false: cu_seqlens = NULL, num_seqs equal sequences
};

class CudaCallVsLayer : public ::testing::TestWithParam<CallCase> {};

// cu_seqlens of n short sequences (some empty, every 97th longer): from 512 sequences on the
// device-built layout scans in a kernel of its own before the fill (device_layout.cu).
std::vector<int64_t> many_sequences(int n) {
  std::vector<int64_t> cu{0};
  for (int i = 0; i < n; ++i) cu.push_back(cu.back() + (i * 7) % 13 + (i % 97 == 0 ? 150 : 0));
  return cu;
}

TEST_P(CudaCallVsLayer, BitIdenticalWithPhiAvg) {
  const CallCase& c = GetParam();
  const NsaConfig cfg = make_config(c.shape, c.hyper, Phi::kAvg, c.kv);
  const SeqLayout layout = SeqLayout::packed(c.cu_seqlens, c.cu_seqlens.back());
  const int64_t T = layout.total_tokens();
  const NsaTensors<float> in = bf16_inputs(cfg, T, 500 + T);
  NsaConfig do_cfg = cfg;
  do_cfg.dk = cfg.dv;
  Tensor<float> d_o = random_nsa_inputs<float>(do_cfg, T, 31).q;
  round_bf16(d_o);

  cuda::NsaCudaLayer layer(cfg, layout);
  layer.set_inputs(in);
  layer.set_output_grad(d_o);
  layer.forward();
  layer.backward();
  NSA_CUDA_CHECK(cudaDeviceSynchronize());

  CallBuffers call(cfg, in, d_o, c.pass_cu ? &c.cu_seqlens : nullptr, layout.num_seqs());
  call.poison();
  cudaStream_t stream;
  NSA_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  call.run(cfg, stream);
  NSA_CUDA_CHECK(cudaStreamSynchronize(stream));
  expect_same_as_layer(cfg, layout, call, layer);

  // bf16 gradients: the fp32 ones rounded to nearest even, bit for bit – with the selected rows
  // in one pass (the block-major branch writes bf16 itself) and in passes of 7 rows (its fp32
  // sums converted after the last pass; the fp32 run then uses the same passes).
  const int64_t row_bytes =
      cuda::sel_partial_bytes_per_row(cfg.heads, cfg.n_sel, cfg.l_sel, cfg.dk, cfg.dv);
  for (const int64_t budget : {int64_t{0}, 7 * row_bytes}) {
    SCOPED_TRACE(budget ? "selected rows in passes of 7" : "selected rows in one pass");
    call.io.sel_partial_budget_bytes = budget;
    if (budget) {
      call.run(cfg, stream);
      NSA_CUDA_CHECK(cudaStreamSynchronize(stream));
    }
    NsaTensors<float> want = call.grads(cfg);
    const NsaTensors<float> got = call.grads_bf16(cfg, stream);
    round_bf16(want.q);
    expect_equal(got.q, want.q, "dq (bf16)");
    for (int b = 0; b < kNumBranches; ++b) {
      const std::string name = kBranchNames[b];
      if (cfg.kv_index(b) == b) {
        round_bf16(want.k[b]), round_bf16(want.v[b]);
        expect_equal(got.k[b], want.k[b], "dk_" + name + " (bf16)");
        expect_equal(got.v[b], want.v[b], "dv_" + name + " (bf16)");
      }
      round_bf16(want.gate[b]);
      expect_equal(got.gate[b], want.gate[b], "dg_" + name + " (bf16)");
    }
  }
  cudaStreamDestroy(stream);
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, CudaCallVsLayer,
    ::testing::Values(
        // name, {H, G, dk, dv}, {l, d, l_sel, n_sel, w}, kv, cu_seqlens, pass cu_seqlens
        CallCase{"h1", {2, 2, 32, 32}, {16, 8, 32, 4, 64}, KvMode::kSeparate, {0, 333}, true},
        CallCase{"h2_packed_with_empty",
                 {4, 2, 16, 16},
                 {16, 8, 32, 5, 40},
                 KvMode::kSeparate,
                 {0, 5, 200, 200, 331, 600},
                 true},
        CallCase{"h6_m7c_like",
                 {12, 2, 64, 64},
                 {32, 16, 64, 16, 512},
                 KvMode::kSeparate,
                 {0, 1500},
                 true},
        CallCase{"h16_paper_like",
                 {16, 1, 192, 128},
                 {32, 16, 64, 6, 100},
                 KvMode::kSeparate,
                 {0, 701},
                 true},
        CallCase{"h3_shared_batch_no_cu",
                 {6, 2, 32, 16},
                 {8, 4, 16, 6, 33},
                 KvMode::kShared,
                 {0, 257, 514},
                 false},
        CallCase{"l_sel_128_packed",
                 {4, 2, 32, 32},
                 {32, 16, 128, 4, 100},
                 KvMode::kSeparate,
                 {0, 70, 400, 401, 900},
                 true},
        CallCase{"short", {4, 1, 16, 16}, {32, 16, 64, 4, 64}, KvMode::kSeparate, {0, 20}, true},
        CallCase{"l_sel_512_query_major",  // the query-major selected branch (l_sel > 256)
                 {4, 2, 32, 32},
                 {32, 16, 512, 3, 64},
                 KvMode::kSeparate,
                 {0, 1300},
                 true},
        CallCase{"many_seqs_scan_kernel",
                 {4, 2, 16, 16},
                 {16, 8, 32, 4, 40},
                 KvMode::kSeparate,
                 many_sequences(600),
                 true},
        CallCase{"many_seqs_fused_build",
                 {4, 2, 16, 16},
                 {16, 8, 32, 4, 40},
                 KvMode::kShared,
                 many_sequences(400),
                 true}),
    [](const auto& info) { return std::string(info.param.name); });

// φ = mlp: the compressed K/V to cuBLAS rounding; everything finite; the same selections almost
// everywhere (a compressed key's last bits can move a near-tie).
TEST(CudaCall, PhiMlpMatchesTheLayer) {
  for (const KvMode kv : {KvMode::kSeparate, KvMode::kShared}) {
    const NsaConfig cfg = make_config({4, 2, 32, 16}, {16, 8, 32, 4, 40}, Phi::kMlp, kv);
    const std::vector<int64_t> cu = {0, 10, 310, 555};
    const SeqLayout layout = SeqLayout::packed(cu, cu.back());
    const int64_t T = layout.total_tokens();
    const NsaTensors<float> in = bf16_inputs(cfg, T, 77);
    NsaConfig do_cfg = cfg;
    do_cfg.dk = cfg.dv;
    Tensor<float> d_o = random_nsa_inputs<float>(do_cfg, T, 32).q;
    round_bf16(d_o);
    cuda::NsaCudaLayer layer(cfg, layout);
    layer.set_inputs(in);
    layer.set_output_grad(d_o);
    layer.forward();
    layer.backward();
    CallBuffers call(cfg, in, d_o, &cu, layout.num_seqs());
    call.poison();
    call.run(cfg, nullptr);
    NSA_CUDA_CHECK(cudaDeviceSynchronize());
    const NsaForward<float> want = layer.download_forward(), got = call.forward(cfg);
    const int64_t C = layout.compressed_offsets(cfg).back();
    expect_close(real_rows(got.k_cmp, C, "k_cmp"), want.k_cmp, 1e-5, 1e-4, "k_cmp (mlp)");
    expect_close(real_rows(got.v_cmp, C, "v_cmp"), want.v_cmp, 1e-5, 1e-4, "v_cmp (mlp)");
    int64_t same = 0;
    for (int64_t i = 0; i < T * cfg.groups; ++i) {
      same += std::equal(got.sel_idx.ptr() + i * cfg.n_sel, got.sel_idx.ptr() + (i + 1) * cfg.n_sel,
                         want.sel_idx.ptr() + i * cfg.n_sel);
    }
    EXPECT_GE(same, T * cfg.groups * 99 / 100) << "selections differ in many rows";
    const NsaTensors<float> gg = call.grads(cfg);
    for (const Tensor<float>* t : {&got.o, &gg.q, &gg.k[0], &gg.v[0], &gg.gate[1]}) {
      for (float x : t->data) ASSERT_TRUE(std::isfinite(x));
    }
    for (int i = 0; i < 5; ++i) {
      for (float x : call.d_phi_k[i].download()) ASSERT_TRUE(std::isfinite(x)) << "dphi_k " << i;
      for (float x : call.d_phi_v[i].download()) ASSERT_TRUE(std::isfinite(x)) << "dphi_v " << i;
    }
  }
}

// A device cu_seqlens cannot be checked on the host without a synchronisation: entries out of
// order are clamped into a valid layout (running maximum, first 0, last T), here {0, 300, 300,
// 600}.
TEST(CudaCall, ClampsACuSeqlensOutOfOrder) {
  const NsaConfig cfg = make_config({4, 2, 32, 32}, {16, 8, 32, 4, 64});
  const std::vector<int64_t> broken = {0, 300, 100, 600}, clamped = {0, 300, 300, 600};
  const SeqLayout layout = SeqLayout::packed(clamped, 600);
  const NsaTensors<float> in = bf16_inputs(cfg, 600, 3);
  NsaConfig do_cfg = cfg;
  do_cfg.dk = cfg.dv;
  Tensor<float> d_o = random_nsa_inputs<float>(do_cfg, 600, 4).q;
  round_bf16(d_o);
  cuda::NsaCudaLayer layer(cfg, layout);
  layer.set_inputs(in);
  layer.set_output_grad(d_o);
  layer.forward();
  layer.backward();
  CallBuffers call(cfg, in, d_o, &broken, 3);
  call.run(cfg, nullptr);
  NSA_CUDA_CHECK(cudaDeviceSynchronize());
  expect_same_as_layer(cfg, layout, call, layer);
}

// No host synchronisation, allocation or host copy inside: forward + backward (φ = mlp, so cuBLAS
// too) capture into a CUDA graph on a stream of their own, and the replay repeats the direct
// results bit for bit. One direct call comes first (it creates the thread's cuBLAS handle).
TEST(CudaCall, ForwardAndBackwardCaptureIntoACudaGraph) {
  const NsaConfig cfg = make_config({4, 2, 32, 16}, {16, 8, 32, 4, 40}, Phi::kMlp, KvMode::kShared);
  const std::vector<int64_t> cu = {0, 10, 310, 555};
  const NsaTensors<float> in = bf16_inputs(cfg, 555, 8);
  NsaConfig do_cfg = cfg;
  do_cfg.dk = cfg.dv;
  Tensor<float> d_o = random_nsa_inputs<float>(do_cfg, 555, 9).q;
  round_bf16(d_o);
  CallBuffers call(cfg, in, d_o, &cu, 3);
  cudaStream_t stream;
  NSA_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  call.run(cfg, stream);
  NSA_CUDA_CHECK(cudaStreamSynchronize(stream));
  const NsaForward<float> direct = call.forward(cfg);
  const NsaTensors<float> direct_grads = call.grads(cfg);

  cudaGraph_t graph;
  NSA_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  call.run(cfg, stream);
  NSA_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  cudaGraphExec_t exec;
  NSA_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  call.poison();
  NSA_CUDA_CHECK(cudaGraphLaunch(exec, stream));
  NSA_CUDA_CHECK(cudaStreamSynchronize(stream));
  const NsaForward<float> replay = call.forward(cfg);
  const NsaTensors<float> replay_grads = call.grads(cfg);
  expect_equal(replay.o, direct.o, "o (graph replay)");
  expect_equal(replay.sel_idx, direct.sel_idx, "sel_idx (graph replay)");
  expect_equal(replay.k_cmp, direct.k_cmp, "k_cmp (graph replay)");
  expect_equal(replay_grads.q, direct_grads.q, "dq (graph replay)");
  expect_equal(replay_grads.k[0], direct_grads.k[0], "dk (graph replay)");
  expect_equal(replay_grads.v[0], direct_grads.v[0], "dv (graph replay)");
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

TEST(CudaCall, ReportsWhatIsNotSupported) {
  const NsaConfig cfg = make_config({4, 2, 48, 48}, {16, 8, 32, 4, 64});
  try {
    cuda::nsa_cuda_check_supported(cfg);
    ADD_FAILURE() << "dk = dv = 48 should be rejected";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("head dims"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace nsa::test
