// The C ABI's CPU entry points over the CPU reference (see nsa_capi.h): buffers in, nsa::Tensor
// copies, the reference's forward/backward, buffers out. Every exception becomes a status and a
// message.
#include <cstring>
#include <string>
#include <tuple>
#include <vector>

#include "capi_common.h"

namespace nsa {
namespace {

using capi::branch_name;
using capi::kPhiNames;
using capi::ref_shape;

// A present tensor may have no elements (compressed K/V of sequences shorter than l), and then
// its pointer may be NULL (an empty PyTorch tensor's is); absent tensors have ndim 0 and NULL.
template <typename T>
Tensor<T> to_tensor(const NsaTensorRef& r, const std::string& name) {
  if (!r.data && (r.ndim == 0 || shape_numel(ref_shape(r, name)) != 0)) return Tensor<T>();
  Tensor<T> t(ref_shape(r, name));
  if (t.numel() > 0) std::memcpy(t.ptr(), r.data, sizeof(T) * static_cast<size_t>(t.numel()));
  return t;
}

// Copies t into the caller's buffer after checking that the buffer has t's shape.
template <typename T>
void from_tensor(const Tensor<T>& t, const NsaTensorRef& r, const std::string& name) {
  NSA_CHECK(r.data || (r.ndim > 0 && t.numel() == 0), "output '", name, "' has no buffer");
  NSA_CHECK(ref_shape(r, name) == t.shape, "output '", name, "' has shape ",
            shape_str(ref_shape(r, name)), ", expected ", shape_str(t.shape));
  if (t.numel() > 0) std::memcpy(r.data, t.ptr(), sizeof(T) * static_cast<size_t>(t.numel()));
}

SeqLayout make_layout(const int64_t* cu_seqlens, int64_t num_seqs, int64_t total_tokens) {
  NSA_CHECK(cu_seqlens && num_seqs >= 1, "cu_seqlens must hold at least 2 entries");
  return SeqLayout::packed(std::vector<int64_t>(cu_seqlens, cu_seqlens + num_seqs + 1),
                           total_tokens);
}

template <typename Real>
NsaTensors<Real> read_inputs(const NsaConfig& cfg, const NsaAttnTensors& in) {
  NsaTensors<Real> t;
  t.q = to_tensor<Real>(in.q, "q");
  for (int c = 0; c < kNumBranches; ++c) {
    if (cfg.kv_index(c) == c) {
      t.k[c] = to_tensor<Real>(in.k[c], branch_name("k", c, cfg));
      t.v[c] = to_tensor<Real>(in.v[c], branch_name("v", c, cfg));
    }
    t.gate[c] = to_tensor<Real>(in.g[c], std::string("g_") + kBranchNames[c]);
  }
  if (cfg.phi == Phi::kMlp) {
    for (auto [dst, src, prefix] :
         {std::tuple{&t.phi_k, in.phi_k, "phi_k_"}, std::tuple{&t.phi_v, in.phi_v, "phi_v_"}}) {
      Tensor<Real>* fields[5] = {&dst->pos, &dst->w1, &dst->b1, &dst->w2, &dst->b2};
      for (int i = 0; i < 5; ++i)
        *fields[i] = to_tensor<Real>(src[i], prefix + std::string(kPhiNames[i]));
    }
  }
  return t;
}

template <typename Real>
NsaForward<Real> read_saved(const NsaAttnSaved& s) {
  NsaForward<Real> f;
  f.o = to_tensor<Real>(s.o, "o");
  for (int c = 0; c < kNumBranches; ++c) {
    f.o_branch[c] = to_tensor<Real>(s.o_branch[c], std::string("o_") + kBranchNames[c]);
    f.lse[c] = to_tensor<Real>(s.lse[c], std::string("lse_") + kBranchNames[c]);
  }
  f.k_cmp = to_tensor<Real>(s.k_cmp, "k_cmp (compressed)");
  f.v_cmp = to_tensor<Real>(s.v_cmp, "v_cmp (compressed)");
  f.sel_idx = to_tensor<int32_t>(s.sel_idx, "sel_idx");
  return f;
}

// selection: null, or the blocks to use instead of choosing (checked by nsa_forward_cpu).
template <typename Real>
void forward(const NsaConfig& cfg, const SeqLayout& layout, const NsaAttnTensors& in,
             const NsaAttnSaved& out, const NsaTensorRef* selection) {
  Tensor<int32_t> given;
  if (selection) {
    NSA_CHECK(selection->data, "the given selection 'sel_idx' has no buffer");
    given = to_tensor<int32_t>(*selection, "sel_idx (given)");
  }
  const NsaForward<Real> f =
      nsa_forward_cpu(cfg, layout, read_inputs<Real>(cfg, in), selection ? &given : nullptr);
  from_tensor(f.o, out.o, "o");
  for (int c = 0; c < kNumBranches; ++c) {
    from_tensor(f.o_branch[c], out.o_branch[c], std::string("o_") + kBranchNames[c]);
    from_tensor(f.lse[c], out.lse[c], std::string("lse_") + kBranchNames[c]);
  }
  from_tensor(f.k_cmp, out.k_cmp, "k_cmp (compressed)");
  from_tensor(f.v_cmp, out.v_cmp, "v_cmp (compressed)");
  from_tensor(f.sel_idx, out.sel_idx, "sel_idx");
}

template <typename Real>
void backward(const NsaConfig& cfg, const SeqLayout& layout, const NsaAttnTensors& in,
              const NsaAttnSaved& saved, const NsaTensorRef& d_o, const NsaAttnTensors& grads) {
  const NsaTensors<Real> x = read_inputs<Real>(cfg, in);
  const NsaForward<Real> f = read_saved<Real>(saved);
  const int64_t T = layout.total_tokens();
  const int64_t C = layout.compressed_offsets(cfg).back();
  for (int c = 0; c < kNumBranches; ++c) {
    check_shape(f.o_branch[c], {T, cfg.heads, cfg.dv}, std::string("o_") + kBranchNames[c]);
    check_shape(f.lse[c], {T, cfg.heads}, std::string("lse_") + kBranchNames[c]);
  }
  check_shape(f.k_cmp, {C, cfg.groups, cfg.dk}, "k_cmp (compressed)");
  check_shape(f.v_cmp, {C, cfg.groups, cfg.dv}, "v_cmp (compressed)");
  check_shape(f.sel_idx, {T, cfg.groups, cfg.n_sel}, "sel_idx");
  Tensor<Real> dout = to_tensor<Real>(d_o, "do");
  check_shape(dout, {T, cfg.heads, cfg.dv}, "do");
  const NsaTensors<Real> g = nsa_backward_cpu(cfg, layout, x, f, dout);
  auto put = [](const Tensor<Real>& t, const NsaTensorRef& r, const std::string& name) {
    if (r.data) from_tensor(t, r, "d" + name);
  };
  put(g.q, grads.q, "q");
  for (int c = 0; c < kNumBranches; ++c) {
    if (cfg.kv_index(c) == c) {
      put(g.k[c], grads.k[c], branch_name("k", c, cfg));
      put(g.v[c], grads.v[c], branch_name("v", c, cfg));
    }
    put(g.gate[c], grads.g[c], std::string("g_") + kBranchNames[c]);
  }
  if (cfg.phi == Phi::kMlp) {
    for (auto [src, dst, prefix] : {std::tuple{&g.phi_k, grads.phi_k, "phi_k_"},
                                    std::tuple{&g.phi_v, grads.phi_v, "phi_v_"}}) {
      const Tensor<Real>* fields[5] = {&src->pos, &src->w1, &src->b1, &src->w2, &src->b2};
      for (int i = 0; i < 5; ++i) put(*fields[i], dst[i], prefix + std::string(kPhiNames[i]));
    }
  }
}

int32_t forward_entry(const NsaAttnConfig* cfg, int32_t dtype, const int64_t* cu_seqlens,
                      int64_t num_seqs, const NsaAttnTensors* in, const NsaTensorRef* selection,
                      const NsaAttnSaved* out, char* err, size_t err_size) {
  return capi::guarded(err, err_size, [&] {
    const NsaConfig c = capi::make_config(cfg);
    const SeqLayout layout = make_layout(cu_seqlens, num_seqs, capi::tokens_of(in));
    NSA_CHECK(out, "outputs are NULL");
    NSA_CHECK(dtype == NSA_F32 || dtype == NSA_F64, "dtype = ", dtype,
              " must be 0 (float32) or 1 (float64)");
    if (dtype == NSA_F32) {
      forward<float>(c, layout, *in, *out, selection);
    } else {
      forward<double>(c, layout, *in, *out, selection);
    }
  });
}

}  // namespace
}  // namespace nsa

extern "C" {

int32_t nsa_capi_version(void) {
  return NSA_CAPI_VERSION;
}

int32_t nsa_compressed_tokens(const NsaAttnConfig* cfg, const int64_t* cu_seqlens, int64_t num_seqs,
                              int64_t* out, char* err, size_t err_size) {
  return nsa::capi::guarded(err, err_size, [&] {
    const nsa::NsaConfig c = nsa::capi::make_config(cfg);
    NSA_CHECK(cu_seqlens && num_seqs >= 1, "cu_seqlens must hold at least 2 entries");
    const nsa::SeqLayout layout = nsa::make_layout(cu_seqlens, num_seqs, cu_seqlens[num_seqs]);
    *out = layout.compressed_offsets(c).back();
  });
}

int32_t nsa_attention_forward_cpu(const NsaAttnConfig* cfg, int32_t dtype,
                                  const int64_t* cu_seqlens, int64_t num_seqs,
                                  const NsaAttnTensors* in, const NsaAttnSaved* out, char* err,
                                  size_t err_size) {
  return nsa::forward_entry(cfg, dtype, cu_seqlens, num_seqs, in, nullptr, out, err, err_size);
}

int32_t nsa_attention_forward_cpu_given_selection(const NsaAttnConfig* cfg, int32_t dtype,
                                                  const int64_t* cu_seqlens, int64_t num_seqs,
                                                  const NsaAttnTensors* in,
                                                  const NsaTensorRef* sel_idx,
                                                  const NsaAttnSaved* out, char* err,
                                                  size_t err_size) {
  static const NsaTensorRef absent{};  // a NULL sel_idx is an error, not "choose"
  return nsa::forward_entry(cfg, dtype, cu_seqlens, num_seqs, in, sel_idx ? sel_idx : &absent, out,
                            err, err_size);
}

int32_t nsa_attention_backward_cpu(const NsaAttnConfig* cfg, int32_t dtype,
                                   const int64_t* cu_seqlens, int64_t num_seqs,
                                   const NsaAttnTensors* in, const NsaAttnSaved* saved,
                                   const NsaTensorRef* d_o, const NsaAttnTensors* grads, char* err,
                                   size_t err_size) {
  return nsa::capi::guarded(err, err_size, [&] {
    const nsa::NsaConfig c = nsa::capi::make_config(cfg);
    const nsa::SeqLayout layout = nsa::make_layout(cu_seqlens, num_seqs, nsa::capi::tokens_of(in));
    NSA_CHECK(saved && d_o && grads, "saved tensors, do or gradients are NULL");
    NSA_CHECK(dtype == NSA_F32 || dtype == NSA_F64, "dtype = ", dtype,
              " must be 0 (float32) or 1 (float64)");
    if (dtype == NSA_F32) {
      nsa::backward<float>(c, layout, *in, *saved, *d_o, *grads);
    } else {
      nsa::backward<double>(c, layout, *in, *saved, *d_o, *grads);
    }
  });
}

}  // extern "C"
