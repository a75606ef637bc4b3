// Compression φ = avg | mlp on the CPU, forward and backward (see compress.h).
#include "compress.h"

#include <cmath>
#include <vector>

namespace nsa::cpu {
namespace {

// Raw start row of every compressed token, across all sequences of the layout: [C].
std::vector<int64_t> block_starts(const NsaConfig& cfg, const SeqLayout& layout) {
  std::vector<int64_t> starts;
  for (int64_t n = 0; n < layout.num_seqs(); ++n) {
    const int64_t count = cfg.num_compressed(layout.length(n));
    for (int64_t i = 0; i < count; ++i) starts.push_back(layout.start(n) + i * cfg.d);
  }
  return starts;
}

template <typename Real>
Real sigmoid(Real u) {
  return Real(1) / (Real(1) + std::exp(-u));
}

// z = concat_r(raw[start + r, g] + pos[r]) for one block.
template <typename Real>
void gather_block(const Tensor<Real>& raw, const PhiMlpParams<Real>& mlp, int64_t start, int64_t g,
                  int64_t l, int64_t G, int64_t D, Real* z) {
  for (int64_t r = 0; r < l; ++r) {
    const Real* x = raw.ptr() + ((start + r) * G + g) * D;
    for (int64_t c = 0; c < D; ++c) z[r * D + c] = x[c] + mlp.pos[r * D + c];
  }
}

// u = W1ᵀ z + b1 for one block.
template <typename Real>
void hidden_preact(const PhiMlpParams<Real>& mlp, const Real* z, int64_t in, int64_t hid, Real* u) {
  for (int64_t k = 0; k < hid; ++k) u[k] = mlp.b1[k];
  for (int64_t r = 0; r < in; ++r) {
    const Real zr = z[r];
    const Real* w = mlp.w1.ptr() + r * hid;
    for (int64_t k = 0; k < hid; ++k) u[k] += zr * w[k];
  }
}

}  // namespace

template <typename Real>
void compress_forward(const NsaConfig& cfg, const SeqLayout& layout, const Tensor<Real>& raw,
                      const PhiMlpParams<Real>* mlp, Tensor<Real>& out) {
  const int64_t G = raw.dim(1), D = raw.dim(2), l = cfg.l;
  const std::vector<int64_t> starts = block_starts(cfg, layout);
  const int64_t C = static_cast<int64_t>(starts.size());
  out = Tensor<Real>({C, G, D});
  const int64_t hid = mlp ? mlp->b1.numel() : 0;
#pragma omp parallel
  {
    std::vector<Real> z(mlp ? l * D : 0), u(hid);
#pragma omp for schedule(static)
    for (int64_t item = 0; item < C * G; ++item) {
      const int64_t i = item / G, g = item % G;
      Real* y = out.ptr() + item * D;
      if (!mlp) {
        for (int64_t r = 0; r < l; ++r) {
          const Real* x = raw.ptr() + ((starts[i] + r) * G + g) * D;
          for (int64_t c = 0; c < D; ++c) y[c] += x[c];
        }
        for (int64_t c = 0; c < D; ++c) y[c] /= static_cast<Real>(l);
        continue;
      }
      gather_block(raw, *mlp, starts[i], g, l, G, D, z.data());
      hidden_preact(*mlp, z.data(), l * D, hid, u.data());
      for (int64_t c = 0; c < D; ++c) y[c] = mlp->b2[c];
      for (int64_t k = 0; k < hid; ++k) {
        const Real h = u[k] * sigmoid(u[k]);
        const Real* w = mlp->w2.ptr() + k * D;
        for (int64_t c = 0; c < D; ++c) y[c] += h * w[c];
      }
    }
  }
}

template <typename Real>
void compress_backward(const NsaConfig& cfg, const SeqLayout& layout, const Tensor<Real>& raw,
                       const PhiMlpParams<Real>* mlp, const Tensor<Real>& d_out,
                       Tensor<Real>& d_raw, PhiMlpParams<Real>* d_mlp) {
  const int64_t G = raw.dim(1), D = raw.dim(2), l = cfg.l;
  const std::vector<int64_t> starts = block_starts(cfg, layout);
  const int64_t C = static_cast<int64_t>(starts.size());
  if (!mlp) {
    // Parallel over groups: each group's raw rows are written by one thread only.
#pragma omp parallel for schedule(static)
    for (int64_t g = 0; g < G; ++g) {
      for (int64_t i = 0; i < C; ++i) {
        const Real* dy = d_out.ptr() + (i * G + g) * D;
        for (int64_t r = 0; r < l; ++r) {
          Real* dx = d_raw.ptr() + ((starts[i] + r) * G + g) * D;
          for (int64_t c = 0; c < D; ++c) dx[c] += dy[c] / static_cast<Real>(l);
        }
      }
    }
    return;
  }
  // φ = mlp: parameter gradients are shared by all blocks, so this runs sequentially in a fixed
  // order (deterministic; the compressor is a small part of the reference's cost).
  const int64_t hid = mlp->b1.numel(), in = l * D;
  std::vector<Real> z(in), u(hid), dh(hid), dz(in);
  for (int64_t i = 0; i < C; ++i) {
    for (int64_t g = 0; g < G; ++g) {
      const Real* dy = d_out.ptr() + (i * G + g) * D;
      gather_block(raw, *mlp, starts[i], g, l, G, D, z.data());
      hidden_preact(*mlp, z.data(), in, hid, u.data());
      for (int64_t c = 0; c < D; ++c) d_mlp->b2[c] += dy[c];
      for (int64_t k = 0; k < hid; ++k) {
        const Real sig = sigmoid(u[k]);
        const Real h = u[k] * sig;
        const Real* w = mlp->w2.ptr() + k * D;
        Real* dw = d_mlp->w2.ptr() + k * D;
        Real dhk = 0;
        for (int64_t c = 0; c < D; ++c) {
          dw[c] += h * dy[c];
          dhk += w[c] * dy[c];
        }
        dh[k] = dhk * sig * (Real(1) + u[k] * (Real(1) - sig));  // through silu
        d_mlp->b1[k] += dh[k];
      }
      for (int64_t r = 0; r < in; ++r) {
        const Real* w = mlp->w1.ptr() + r * hid;
        Real* dw = d_mlp->w1.ptr() + r * hid;
        Real acc = 0;
        for (int64_t k = 0; k < hid; ++k) {
          dw[k] += z[r] * dh[k];
          acc += w[k] * dh[k];
        }
        dz[r] = acc;
      }
      for (int64_t r = 0; r < l; ++r) {
        Real* dx = d_raw.ptr() + ((starts[i] + r) * G + g) * D;
        for (int64_t c = 0; c < D; ++c) {
          dx[c] += dz[r * D + c];
          d_mlp->pos[r * D + c] += dz[r * D + c];
        }
      }
    }
  }
}

#define NSA_INSTANTIATE(Real)                                                                    \
  template void compress_forward<Real>(const NsaConfig&, const SeqLayout&, const Tensor<Real>&,  \
                                       const PhiMlpParams<Real>*, Tensor<Real>&);                \
  template void compress_backward<Real>(const NsaConfig&, const SeqLayout&, const Tensor<Real>&, \
                                        const PhiMlpParams<Real>*, const Tensor<Real>&,          \
                                        Tensor<Real>&, PhiMlpParams<Real>*);
NSA_INSTANTIATE(float)
NSA_INSTANTIATE(double)
#undef NSA_INSTANTIATE

}  // namespace nsa::cpu
