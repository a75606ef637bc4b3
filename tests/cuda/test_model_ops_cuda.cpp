// The model's element-wise kernels take a vector path (128-bit loads, several elements per thread)
// where the pointers are aligned and a scalar path otherwise; both must give the same bits, so
// the vector path changes no result of the model. Each kernel runs on the same data twice – at
// aligned addresses and at addresses one element off (forcing the scalar path) – with sizes that
// leave a tail. Also: the GEMM's residual form equals a copy followed by the in-place GEMM, RoPE
// rotates by the angles computed on the host, and the column sums equal the host's; the decoder's
// small-batch products (gemv.h's few-row kernels, skinny_gemm.h's tensor-core ones) against host
// sums, and a row's bits whatever the batch around it; the decoder's one-kernel attention inputs
// (decode_projection.h) against the product + decode_inputs.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <utility>
#include <vector>

#include "cuda/common/convert.h"
#include "cuda/common/device_buffer.h"
#include "model/cuda/decode_projection.h"
#include "model/cuda/gemm.h"
#include "model/cuda/gemv.h"
#include "model/cuda/model_ops.h"
#include "model/cuda/skinny_gemm.h"

namespace nsa::cuda {
namespace {

std::vector<float> random_floats(int64_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = dist(rng);
  return v;
}

std::vector<bf16> to_bf16(const std::vector<float>& v) {
  std::vector<bf16> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = __float2bfloat16(v[i]);
  return out;
}

// Device copies of host data at element offset `off` (0: aligned; 1: one element off).
template <typename T>
struct Placed {
  DeviceBuffer<T> buf;
  int64_t off, n;
  Placed(const std::vector<T>& host, int64_t offset) : off(offset), n(host.size()) {
    buf.resize(n + 8);
    buf.zero();
    NSA_CUDA_CHECK(cudaMemcpy(buf.get() + off, host.data(), n * sizeof(T), cudaMemcpyHostToDevice));
  }
  Placed(int64_t count, int64_t offset) : off(offset), n(count) {
    buf.resize(n + 8);
    buf.zero();
  }
  T* get() { return buf.get() + off; }
  std::vector<T> host() {
    NSA_CUDA_CHECK(cudaDeviceSynchronize());
    std::vector<T> out(static_cast<size_t>(n));
    NSA_CUDA_CHECK(cudaMemcpy(out.data(), get(), n * sizeof(T), cudaMemcpyDeviceToHost));
    return out;
  }
};

template <typename T>
void expect_same_bits(const std::vector<T>& a, const std::vector<T>& b, const char* what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(T))) << what;
}

TEST(ModelOpsVectorPaths, SwigluForwardAndBackward) {
  const int64_t n = 8 * 1000 + 5;
  const auto u1 = to_bf16(random_floats(n, 1, 2.0f)), u3 = to_bf16(random_floats(n, 2));
  const auto dm = to_bf16(random_floats(n, 3));
  for (bool gated : {true, false}) {
    std::vector<std::vector<bf16>> m(2), m_again(2), du1(2), du3(2);
    for (int64_t off : {0, 1}) {
      Placed<bf16> a(u1, off), b(u3, off), out(n, off), again(n, off), g1(n, off), g3(n, off);
      Placed<bf16> d(dm, off);
      launch_swiglu_forward(a.get(), gated ? b.get() : nullptr, out.get(), n, nullptr);
      launch_swiglu_backward(a.get(), gated ? b.get() : nullptr, d.get(), g1.get(),
                             gated ? g3.get() : nullptr, again.get(), n, nullptr);
      m[off] = out.host(), m_again[off] = again.host(), du1[off] = g1.host(), du3[off] = g3.host();
    }
    expect_same_bits(m[0], m[1], gated ? "swiglu m" : "silu m");
    expect_same_bits(m[0], m_again[0], "m from the backward (vector path)");
    expect_same_bits(m[1], m_again[1], "m from the backward (scalar path)");
    expect_same_bits(du1[0], du1[1], "du1");
    expect_same_bits(du3[0], du3[1], "du3");
  }
}

TEST(ModelOpsVectorPaths, F32ToBf16) {
  const int64_t n = 4 * 999 + 3;
  const auto x = random_floats(n, 4, 100.0f);
  std::vector<std::vector<bf16>> out(2);
  for (int64_t off : {0, 1}) {
    Placed<float> src(x, off);
    Placed<bf16> dst(n, off);
    launch_f32_to_bf16(src.get(), dst.get(), n, nullptr);
    out[off] = dst.host();
  }
  expect_same_bits(out[0], out[1], "f32_to_bf16");
  for (int64_t i = 0; i < n; ++i) {  // and round to nearest even, as the host rounds
    const bf16 h = __float2bfloat16(x[i]);
    ASSERT_EQ(0, std::memcmp(&h, &out[0][i], sizeof(bf16))) << "element " << i;
  }
}

// Several conversions in one launch, of different lengths (a partial vector at the end), on
// aligned and misaligned pointers (one element at a time): each its own elements, rounded as the
// host rounds, nothing past them.
TEST(ModelOpsVectorPaths, F32ToBf16Batch) {
  const int64_t counts[3] = {4 * 1500 + 3, 7, 4 * 300};
  for (int64_t off : {0, 1}) {
    std::vector<std::vector<float>> x;
    std::vector<Placed<float>> src;
    std::vector<Placed<bf16>> dst;
    F32ToBf16Batch batch;
    for (int j = 0; j < 3; ++j) {
      x.push_back(random_floats(counts[j], 21 + j, 50.0f));
      src.emplace_back(x[j], off);
      dst.emplace_back(counts[j] + 4, off);  // four guard elements, zero
    }
    for (int j = 0; j < 3; ++j) batch.add(src[j].get(), dst[j].get(), counts[j]);
    launch_f32_to_bf16_batch(batch, nullptr);
    for (int j = 0; j < 3; ++j) {
      const auto h = dst[j].host();
      for (int64_t i = 0; i < counts[j] + 4; ++i) {
        const bf16 want = __float2bfloat16(i < counts[j] ? x[j][i] : 0.0f);
        ASSERT_EQ(0, std::memcmp(&want, &h[i], sizeof(bf16)))
            << "offset " << off << " conversion " << j << " element " << i;
      }
    }
  }
}

TEST(ModelOpsVectorPaths, F32ToBf16IntoColumns) {
  const int64_t rows = 33, cols = 12, ld = 52, col = 4;
  const auto x = random_floats(rows * cols, 15, 10.0f);
  for (int64_t off : {0, 1}) {
    Placed<float> src(x, off);
    Placed<bf16> dst(rows * ld, off);
    launch_f32_to_bf16_rows(src.get(), rows, cols, dst.get() + col, ld, nullptr);
    const auto h = dst.host();
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < ld; ++c) {
        const bf16 want = c >= col && c < col + cols ? __float2bfloat16(x[r * cols + c - col])
                                                     : __float2bfloat16(0.0f);
        ASSERT_EQ(0, std::memcmp(&want, &h[r * ld + c], sizeof(bf16)))
            << "offset " << off << " row " << r << " column " << c;
      }
    }
  }
}

TEST(ModelOpsVectorPaths, RmsNormForwardAndBackward) {
  // One CTA's rows; several CTAs and a partial last one; a wide row; a width whose column sums do
  // not fit shared memory (they go to the scratch); a width not a multiple of 4 (scalars only).
  for (const auto& [T, D] : std::vector<std::pair<int64_t, int64_t>>{
           {37, 768}, {200, 768}, {70, 6500}, {3, 52000}, {9, 30}}) {
    const auto x = random_floats(T * D, 5), w = random_floats(D, 6), dy = random_floats(T * D, 7);
    const auto dx0 = random_floats(T * D, 8);
    std::vector<std::vector<bf16>> y(2), dxb(2), dxb_converted(2);
    std::vector<std::vector<float>> rstd(2), dx(2), dw(2);
    for (int64_t off : {0, 1}) {
      Placed<float> px(x, off), pw(w, off), pdy(dy, off), pdx(dx0, off), pr(T, off), pdw(D, off);
      Placed<bf16> py(T * D, off), pdxb(T * D, off), conv(T * D, off);
      Placed<float> partial(rmsnorm_backward_partial_floats(T, D), off);
      launch_rmsnorm_forward(px.get(), pw.get(), 1e-5f, py.get(), pr.get(), T, D, nullptr);
      launch_rmsnorm_backward(px.get(), pw.get(), pr.get(), pdy.get(), pdx.get(), true, pdxb.get(),
                              pdw.get(), partial.get(), T, D, nullptr);
      launch_f32_to_bf16(pdx.get(), conv.get(), T * D, nullptr);
      y[off] = py.host(), rstd[off] = pr.host(), dx[off] = pdx.host(), dw[off] = pdw.host();
      dxb[off] = pdxb.host(), dxb_converted[off] = conv.host();
    }
    expect_same_bits(y[0], y[1], "rmsnorm y");
    expect_same_bits(rstd[0], rstd[1], "rstd");
    expect_same_bits(dx[0], dx[1], "dx");
    expect_same_bits(dw[0], dw[1], "dw");
    expect_same_bits(dxb[0], dxb[1], "dx in bf16");
    expect_same_bits(dxb[0], dxb_converted[0], "dx in bf16 vs converted");  // the dropped pass
    // And the values, against the host in double.
    std::vector<double> dw_want(static_cast<size_t>(D), 0.0);
    for (int64_t t = 0; t < T; ++t) {
      double ss = 0, dot = 0;
      for (int64_t j = 0; j < D; ++j) ss += static_cast<double>(x[t * D + j]) * x[t * D + j];
      const double r = 1.0 / std::sqrt(ss / D + 1e-5);
      ASSERT_NEAR(rstd[0][t], r, 1e-4 * r) << "row " << t;
      for (int64_t j = 0; j < D; ++j)
        dot += static_cast<double>(dy[t * D + j]) * w[j] * x[t * D + j] * r;
      dot /= D;
      for (int64_t j = 0; j < D; ++j) {
        const double xh = x[t * D + j] * r;
        const double g = dx0[t * D + j] + r * (dy[t * D + j] * w[j] - xh * dot);
        ASSERT_NEAR(dx[0][t * D + j], g, 1e-3 * (std::fabs(g) + 1.0))
            << "row " << t << " col " << j;
        ASSERT_NEAR(__bfloat162float(y[0][t * D + j]), xh * w[j],
                    1e-2 * std::fabs(xh * w[j]) + 1e-3);
        dw_want[j] += dy[t * D + j] * xh;
      }
    }
    for (int64_t j = 0; j < D; ++j) {
      ASSERT_NEAR(dw[0][j], dw_want[j], 1e-3 * (std::fabs(dw_want[j]) + std::sqrt(T)))
          << "T " << T << " D " << D << " column " << j;
    }
  }
}

TEST(ModelOpsVectorPaths, Rope) {
  const int64_t T = 41, heads = 3, D = 64, n_pos = 1000;
  const double base = 10000.0;
  const auto x = random_floats(T * heads * D, 9);
  std::vector<int32_t> pos(static_cast<size_t>(T));
  for (int64_t t = 0; t < T; ++t) pos[t] = static_cast<int32_t>(t * 37 % n_pos);
  DeviceBuffer<int32_t> positions;
  positions.upload(pos.data(), T);
  DeviceBuffer<float2> table;
  table.resize(n_pos * (D / 2));
  launch_rope_table(n_pos, D, base, table.get(), nullptr);
  for (bool inverse : {false, true}) {
    std::vector<std::vector<bf16>> out(2);
    for (int64_t off : {0, 1}) {
      Placed<float> in(x, off);
      Placed<bf16> o(T * heads * D, off);
      launch_rope_to_bf16(in.get(), o.get(), heads * D, positions.get(), table.get(), T, heads, D,
                          inverse, nullptr);
      out[off] = o.host();
    }
    expect_same_bits(out[0], out[1], inverse ? "rope inverse" : "rope");
    // Into a column block of a wider matrix (rows ld apart): the same values at their places.
    const int64_t ld = heads * D + 20, col = 8;
    Placed<float> in(x, 0);
    Placed<bf16> wide(T * ld, 0);
    launch_rope_to_bf16(in.get(), wide.get() + col, ld, positions.get(), table.get(), T, heads, D,
                        inverse, nullptr);
    const auto w = wide.host();
    for (int64_t t = 0; t < T; ++t) {
      ASSERT_EQ(0, std::memcmp(&w[t * ld + col], &out[0][t * heads * D], heads * D * sizeof(bf16)))
          << "row " << t;
    }
    // And the rotation itself, against the angles computed here in double.
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t h = 0; h < heads; ++h) {
        for (int64_t i = 0; i < D / 2; ++i) {
          const double th = pos[t] * std::pow(base, -2.0 * static_cast<double>(i) / D);
          const double c = std::cos(th), sn = inverse ? -std::sin(th) : std::sin(th);
          const int64_t k = (t * heads + h) * D + 2 * i;
          const double r0 = x[k] * c - x[k + 1] * sn, r1 = x[k] * sn + x[k + 1] * c;
          ASSERT_NEAR(__bfloat162float(out[0][k]), r0, 1e-2 * std::fabs(r0) + 1e-5)
              << "t " << t << " h " << h << " pair " << i;
          ASSERT_NEAR(__bfloat162float(out[0][k + 1]), r1, 1e-2 * std::fabs(r1) + 1e-5)
              << "t " << t << " h " << h << " pair " << i;
        }
      }
    }
  }
}

TEST(ModelOps, ColumnSumAccumulate) {
  // Shapes of the model's calls: norm weights (D = 768), gate biases (3H), the gate's three
  // branches over T·H rows (more chunks than a warp has lanes).
  for (const auto& [T, D] :
       std::vector<std::pair<int64_t, int64_t>>{{37, 768}, {1000, 36}, {70001, 3}}) {
    const auto in = random_floats(T * D, 13);
    const auto start = random_floats(D, 14);
    std::vector<std::vector<float>> runs;
    for (int run = 0; run < 2; ++run) {
      Placed<float> pin(in, 0), out(start, 0), partial(column_sum_partial_floats(T, D), 0);
      launch_column_sum_accumulate(pin.get(), T, D, partial.get(), out.get(), nullptr);
      runs.push_back(out.host());
    }
    expect_same_bits(runs[0], runs[1], "column sums, run to run");
    for (int64_t j = 0; j < D; ++j) {
      double want = start[j];
      for (int64_t t = 0; t < T; ++t) want += in[t * D + j];
      ASSERT_NEAR(runs[0][j], want, 1e-4 * std::sqrt(static_cast<double>(T)) + 1e-5)
          << "T " << T << " D " << D << " column " << j;
    }
  }
}

TEST(ModelOpsVectorPaths, GemmResidualEqualsCopyThenAccumulate) {
  const int64_t T = 300, in = 96, out = 80;
  const auto x = to_bf16(random_floats(T * in, 10)), w = to_bf16(random_floats(out * in, 11));
  const auto res = random_floats(T * out, 12);
  Placed<bf16> px(x, 0), pw(w, 0);
  Placed<float> pres(res, 0), y1(res, 0), y2(T * out, 0);
  Gemm gemm;
  gemm.linear_forward(px.get(), pw.get(), f32(y1.get()), T, in, out, 1.0f, nullptr);
  gemm.linear_forward_residual(px.get(), pw.get(), pres.get(), y2.get(), T, in, out, nullptr);
  expect_same_bits(y1.host(), y2.host(), "x·Wᵀ + residual");
  expect_same_bits(pres.host(), res, "the residual is only read");
}

// Host x·Wᵀ in double for row b, column n, and Σ|x·w| (the scale of its rounding error).
std::pair<double, double> host_dot(const std::vector<bf16>& x, const std::vector<bf16>& w,
                                   int64_t b, int64_t n, int64_t in) {
  double sum = 0.0, mag = 0.0;
  for (int64_t k = 0; k < in; ++k) {
    const double p = static_cast<double>(__bfloat162float(x[b * in + k])) *
                     static_cast<double>(__bfloat162float(w[n * in + k]));
    sum += p;
    mag += std::fabs(p);
  }
  return {sum, mag};
}

// The decoder's two families of small-batch products (gemv.h: up to 4 rows; skinny_gemm.h: up
// to 16 on the tensor cores), the same calls, with the shapes each is tested on and the bound of
// its fp32 sums' rounding (relative to Σ|x·w|).
struct SmallProducts {
  const char* name;
  decltype(&launch_gemv) plain;
  decltype(&launch_gemv_swiglu) swiglu;
  std::vector<std::tuple<int64_t, int64_t, int64_t>> shapes;  // B, in, out
  std::vector<std::pair<int64_t, int64_t>> normed_shapes;     // B, in
  std::vector<int64_t> swiglu_rows;                           // B of the SwiGLU test
  double rel_tol;
};

std::vector<SmallProducts> small_products() {
  // Few-row: in = 2056 is past the kernel's prefetched chunks (2048), so its loop runs too.
  // Skinny: one n-tile (B ≤ 8) and two; in = 2080 and 4128 are 65 and 129 chunks of 32 over 16
  // warps, so a warp's run takes its loop past the first loads (and some warps run short); out
  // not a multiple of the 16 rows a CTA takes. The normed shapes keep their staged rows within
  // the 192 KiB the kernel takes (16 rows of 2080 would not: skinny_gemm_fits refuses them).
  return {{"few-row",
           launch_gemv,
           launch_gemv_swiglu,
           {{1, 768, 130}, {3, 8, 5}, {4, 2056, 67}, {2, 768, 33}},
           {{1, 768}, {3, 2056}, {4, 64}},
           {1, 4},
           1e-5},
          {"skinny",
           launch_skinny_gemm,
           launch_skinny_swiglu,
           {{4, 768, 130}, {9, 2080, 67}, {16, 64, 33}, {1, 32, 16}, {12, 4128, 40}, {8, 96, 7}},
           {{4, 768}, {16, 1056}, {10, 2080}, {9, 64}},
           {4, 11},
           4e-5}};
}

TEST(ModelOps, SmallProductsAgainstHostSums) {
  for (const SmallProducts& k : small_products()) {
    for (const auto& [B, in, out] : k.shapes) {
      SCOPED_TRACE(testing::Message() << k.name << " B=" << B << " in=" << in << " out=" << out);
      const auto x = to_bf16(random_floats(B * in, 20)), w = to_bf16(random_floats(out * in, 21));
      const auto res = random_floats(B * out, 22);
      Placed<bf16> px(x, 0), pw(w, 0), yb(B * out, 0);
      Placed<float> y(B * out, 0), yacc(res, 0);
      k.plain(gemv_rows(px.get()), pw.get(), f32(y.get()), B, in, out, 0.0f, nullptr);
      k.plain(gemv_rows(px.get()), pw.get(), f32(yacc.get()), B, in, out, 1.0f, nullptr);
      k.plain(gemv_rows(px.get()), pw.get(), b16(yb.get()), B, in, out, 0.0f, nullptr);
      const auto hy = y.host(), hacc = yacc.host();
      const auto hb = yb.host();
      for (int64_t b = 0; b < B; ++b) {
        for (int64_t n = 0; n < out; ++n) {
          const auto [ref, mag] = host_dot(x, w, b, n, in);
          const int64_t i = b * out + n;
          ASSERT_NEAR(hy[i], ref, k.rel_tol * mag + 1e-6) << "b=" << b << " n=" << n;
          ASSERT_EQ(hacc[i], res[i] + hy[i]) << "y += x·Wᵀ at b=" << b << " n=" << n;
          ASSERT_EQ(__bfloat162float(hb[i]), __bfloat162float(__float2bfloat16(hy[i])))
              << "the bf16 result is the fp32 one rounded, b=" << b << " n=" << n;
        }
      }
      // Each row alone gives its bits of the batch (fixed order, whatever the other rows hold;
      // in the skinny kernel a row past 8 moves from the second n-tile to the first).
      for (int64_t b = 0; b < B; ++b) {
        Placed<float> y1(out, 0);
        k.plain(gemv_rows(px.get() + b * in), pw.get(), f32(y1.get()), 1, in, out, 0.0f, nullptr);
        expect_same_bits(y1.host(),
                         std::vector<float>(hy.begin() + b * out, hy.begin() + (b + 1) * out),
                         "a row alone");
      }
    }
  }
}

TEST(ModelOps, SmallProductsSwigluAgainstHostSums) {
  for (const SmallProducts& k : small_products()) {
    for (const int64_t B : k.swiglu_rows) {
      SCOPED_TRACE(testing::Message() << k.name << " B=" << B);
      const int64_t in = 768, out = 96;
      const auto x = to_bf16(random_floats(B * in, 30, 0.05f));
      const auto w1 = to_bf16(random_floats(out * in, 31)),
                 w3 = to_bf16(random_floats(out * in, 32));
      Placed<bf16> px(x, 0), pw1(w1, 0), pw3(w3, 0), m(B * out, 0), m_silu(B * out, 0);
      Placed<float> u1(B * out, 0), u3(B * out, 0);
      k.swiglu(gemv_rows(px.get()), pw1.get(), pw3.get(), m.get(), B, in, out, nullptr);
      k.swiglu(gemv_rows(px.get()), pw1.get(), nullptr, m_silu.get(), B, in, out, nullptr);
      k.plain(gemv_rows(px.get()), pw1.get(), f32(u1.get()), B, in, out, 0.0f, nullptr);
      k.plain(gemv_rows(px.get()), pw3.get(), f32(u3.get()), B, in, out, 0.0f, nullptr);
      const auto hm = m.host(), hs = m_silu.host();
      const auto h1 = u1.host(), h3 = u3.host();
      const auto silu = [](float a) { return a / (1.0f + std::exp(-a)); };
      for (int64_t i = 0; i < B * out; ++i) {
        // u1, u3 are the plain products' sums (the same order) rounded to bf16.
        const float a = __bfloat162float(__float2bfloat16(h1[i]));
        const float c = __bfloat162float(__float2bfloat16(h3[i]));
        const float want = silu(a) * c, want_silu = silu(a);
        ASSERT_NEAR(__bfloat162float(hm[i]), want, std::fabs(want) / 128 + 1e-6) << i;
        ASSERT_NEAR(__bfloat162float(hs[i]), want_silu, std::fabs(want_silu) / 128 + 1e-6) << i;
      }
    }
  }
}

// The RMSNorm folded into the products gives the bits of the norm kernel followed by them.
TEST(ModelOps, SmallProductsWithTheNormEqualNormThenProducts) {
  for (const SmallProducts& k : small_products()) {
    for (const auto& [B, in] : k.normed_shapes) {
      SCOPED_TRACE(testing::Message() << k.name << " B=" << B << " in=" << in);
      const int64_t out = 70;
      const auto xf = random_floats(B * in, 40, 3.0f), nw = random_floats(in, 41);
      const auto w1 = to_bf16(random_floats(out * in, 42)),
                 w3 = to_bf16(random_floats(out * in, 43));
      Placed<float> px(xf, 0), pn(nw, 0), rstd(B, 0), y_fused(B * out, 0), y_plain(B * out, 0);
      Placed<bf16> h(B * in, 0), pw1(w1, 0), pw3(w3, 0), m_fused(B * out, 0), m_plain(B * out, 0);
      launch_rmsnorm_forward(px.get(), pn.get(), 1e-5f, h.get(), rstd.get(), B, in, nullptr);
      const GemvInput normed = gemv_normed_rows(px.get(), pn.get(), 1e-5f);
      k.plain(normed, pw1.get(), f32(y_fused.get()), B, in, out, 0.0f, nullptr);
      k.plain(gemv_rows(h.get()), pw1.get(), f32(y_plain.get()), B, in, out, 0.0f, nullptr);
      expect_same_bits(y_fused.host(), y_plain.host(), "RMSNorm(x)·Wᵀ");
      k.swiglu(normed, pw1.get(), pw3.get(), m_fused.get(), B, in, out, nullptr);
      k.swiglu(gemv_rows(h.get()), pw1.get(), pw3.get(), m_plain.get(), B, in, out, nullptr);
      expect_same_bits(m_fused.host(), m_plain.host(), "swiglu of RMSNorm(x)");
    }
  }
}

TEST(ModelOps, GemvRefusesWhatItDoesNotTake) {
  DeviceBuffer<bf16> x(64), w(64);
  EXPECT_FALSE(gemv_fits(kGemvMaxRows + 1, 8, gemv_rows(x.get()), w.get()));
  EXPECT_FALSE(gemv_fits(1, 12, gemv_rows(x.get()), w.get()));
  EXPECT_FALSE(gemv_fits(1, 8, gemv_rows(x.get() + 1), w.get()));
  EXPECT_TRUE(gemv_fits(kGemvMaxRows, 8, gemv_rows(x.get()), w.get()));
  DeviceBuffer<float> xf(64), nw(64);
  EXPECT_TRUE(gemv_fits(1, 8, gemv_normed_rows(xf.get(), nw.get(), 1e-5f), w.get()));
  EXPECT_FALSE(gemv_fits(1, 8, gemv_normed_rows(xf.get(), nullptr, 1e-5f), w.get()));
  EXPECT_FALSE(gemv_fits(1, 8, gemv_normed_rows(xf.get() + 1, nw.get(), 1e-5f), w.get()));
  EXPECT_THROW(launch_gemv(gemv_rows(x.get()), w.get(), b16(x.get()), 1, 8, 1, 1.0f, nullptr),
               Error);
}

TEST(ModelOps, SkinnyGemmRefusesWhatItDoesNotTake) {
  DeviceBuffer<bf16> x(64), w(64);
  EXPECT_FALSE(skinny_gemm_fits(kSkinnyMaxRows + 1, 32, gemv_rows(x.get()), w.get()));
  EXPECT_FALSE(skinny_gemm_fits(0, 32, gemv_rows(x.get()), w.get()));
  EXPECT_FALSE(skinny_gemm_fits(1, 48, gemv_rows(x.get()), w.get()));
  EXPECT_FALSE(skinny_gemm_fits(1, 32, gemv_rows(x.get() + 1), w.get()));
  EXPECT_TRUE(skinny_gemm_fits(kSkinnyMaxRows, 32, gemv_rows(x.get()), w.get()));
  DeviceBuffer<float> xf(64), nw(64);
  EXPECT_TRUE(skinny_gemm_fits(1, 32, gemv_normed_rows(xf.get(), nw.get(), 1e-5f), w.get()));
  EXPECT_FALSE(skinny_gemm_fits(1, 32, gemv_normed_rows(xf.get(), nullptr, 1e-5f), w.get()));
  EXPECT_FALSE(skinny_gemm_fits(16, 8192, gemv_normed_rows(xf.get(), nw.get(), 1e-5f), w.get()))
      << "normalised rows past 192 KiB of shared memory";
  EXPECT_FALSE(skinny_gemm_fits(16, 2016, gemv_normed_rows(xf.get(), nw.get(), 1e-5f), w.get()))
      << "197 KiB of staged rows and the kernel's 32 KiB of partial tiles past a CTA's 227 KiB";
  EXPECT_TRUE(skinny_gemm_fits(16, 1536, gemv_normed_rows(xf.get(), nw.get(), 1e-5f), w.get()));
  EXPECT_THROW(
      launch_skinny_gemm(gemv_rows(x.get()), w.get(), b16(x.get()), 1, 32, 1, 1.0f, nullptr),
      Error);
  EXPECT_THROW(
      launch_skinny_gemm(gemv_rows(x.get()), w.get(), f32(nullptr), 1, 48, 1, 0.0f, nullptr),
      Error);
}

// A decode step's fused projection laid out as the decoder lays it out (decode_inputs_layout) and
// its output buffers, zeroed: q, then per branch its k and v (own K/V) and its gate (gates), each
// named, and whether the kernels leave it nonzero (all but a disabled branch's gates).
struct ProjectionLayout {
  DecodeInputs in{};
  std::vector<DeviceBuffer<bf16>> outs;
  std::vector<std::string> names;
  std::vector<bool> nonzero;
  ProjectionLayout(int64_t B, int64_t H, int64_t G, int64_t dk, int64_t dv,
                   const std::vector<int>& own_kv, bool gates, bool softmax,
                   const std::vector<bool>& enabled) {
    bool kv[3] = {false, false, false};
    for (int c : own_kv) kv[c] = true;
    in = decode_inputs_layout(H, G, dk, dv, kv, gates, softmax);
    const auto add = [&](int64_t n, const std::string& name, bool filled) {
      outs.emplace_back(n);
      outs.back().zero();
      names.push_back(name);
      nonzero.push_back(filled);
      return outs.back().get();
    };
    outs.reserve(10);
    in.q = add(B * H * dk, "q", true);
    for (int c = 0; c < 3; ++c) {
      const std::string br = std::to_string(c);
      in.enabled[c] = enabled[static_cast<size_t>(c)];
      in.k[c] = kv[c] ? add(B * G * dk, "k" + br, true) : nullptr;
      in.v[c] = kv[c] ? add(B * G * dv, "v" + br, true) : nullptr;
      in.gate[c] = gates ? add(B * H, "gate" + br, in.enabled[c]) : nullptr;
    }
  }
  std::vector<std::vector<bf16>> host() {
    NSA_CUDA_CHECK(cudaDeviceSynchronize());
    std::vector<std::vector<bf16>> out;
    for (DeviceBuffer<bf16>& b : outs) {
      out.emplace_back(b.size());
      NSA_CUDA_CHECK(
          cudaMemcpy(out.back().data(), b.get(), b.size() * sizeof(bf16), cudaMemcpyDeviceToHost));
    }
    return out;
  }
};

TEST(ModelOps, DecodeProjectionEqualsProductThenDecodeInputs) {
  struct Case {
    int64_t B, D, H, G, dk, dv;
    std::vector<int> own_kv;
    bool gates, softmax;
    std::vector<bool> enabled;
  };
  // m7c_125m's layout (width 1572); a small one whose width (105) leaves a partial CTA, with
  // shared K/V, sigmoid gates and a disabled branch; dense decoding's (no gates, one K/V).
  const std::vector<Case> cases = {
      {1, 768, 12, 2, 64, 64, {0, 1, 2}, true, true, {true, true, true}},
      {3, 768, 12, 2, 64, 64, {0, 1, 2}, true, true, {true, true, true}},
      {2, 40, 3, 1, 16, 8, {0, 2}, true, false, {true, false, true}},
      {4, 2056, 3, 1, 16, 8, {0, 2}, true, false, {true, true, true}},
      {2, 64, 4, 2, 32, 32, {1}, false, false, {true, true, true}}};
  for (const Case& k : cases) {
    SCOPED_TRACE(testing::Message()
                 << "B=" << k.B << " D=" << k.D << " H=" << k.H << " dk=" << k.dk);
    ProjectionLayout fused(k.B, k.H, k.G, k.dk, k.dv, k.own_kv, k.gates, k.softmax, k.enabled);
    ProjectionLayout ref(k.B, k.H, k.G, k.dk, k.dv, k.own_kv, k.gates, k.softmax, k.enabled);
    const int64_t width = fused.in.width;
    const auto xf = random_floats(k.B * k.D, 50, 2.0f), nw = random_floats(k.D, 51);
    const auto w = to_bf16(random_floats(width * k.D, 52, 0.05f));
    const auto bias = random_floats(3 * k.H, 53);
    const std::vector<int32_t> pos = {0, 65535, 7, 1000};
    Placed<float> px(xf, 0), pn(nw, 0), pb(bias, 0), proj(k.B * width, 0);
    Placed<bf16> pw(w, 0);
    Placed<int32_t> ppos(std::vector<int32_t>(pos.begin(), pos.begin() + k.B), 0);
    const GemvInput x = gemv_normed_rows(px.get(), pn.get(), 1e-5f);
    ASSERT_TRUE(decode_projection_fits(x, pw.get(), fused.in, k.B, k.D));
    launch_decode_projection(x, pw.get(), fused.in, ppos.get(), pb.get(), 10000.0, k.B, k.D,
                             nullptr);
    launch_gemv(x, pw.get(), f32(proj.get()), k.B, k.D, width, 0.0f, nullptr);
    launch_decode_inputs(proj.get(), ref.in, ppos.get(), pb.get(), 10000.0, k.B, nullptr);
    const auto got = fused.host(), want = ref.host();
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i) {
      expect_same_bits(got[i], want[i], fused.names[i].c_str());
      // Not a trivial pass: every buffer the kernels fill is not left all zero.
      bool nonzero = false;
      for (const bf16 v : got[i]) nonzero = nonzero || __bfloat162float(v) != 0.0f;
      EXPECT_EQ(nonzero, static_cast<bool>(fused.nonzero[i])) << fused.names[i];
    }
  }
}

TEST(ModelOps, DecodeProjectionRefusesMisalignedLayouts) {
  // Gate logits at offset 28 (not a multiple of 3; decode_inputs_layout pads them to 30): a
  // triple would straddle two CTAs.
  ProjectionLayout odd(1, 2, 1, 8, 4, {0}, true, true, {true, true, true});
  ASSERT_EQ(odd.in.gate_offset, 30);
  odd.in.gate_offset = 28, odd.in.width = 28 + 3 * 2;
  DeviceBuffer<float> x(64), nw(64);
  DeviceBuffer<bf16> w(odd.in.width * 64);
  const GemvInput rows = gemv_normed_rows(x.get(), nw.get(), 1e-5f);
  EXPECT_FALSE(decode_projection_fits(rows, w.get(), odd.in, 1, 64));
  EXPECT_THROW(
      launch_decode_projection(rows, w.get(), odd.in, nullptr, nullptr, 10000.0, 1, 64, nullptr),
      Error);
  ProjectionLayout fine(1, 2, 1, 8, 6, {0}, true, true, {true, true, true});
  ASSERT_EQ(fine.in.gate_offset, 30);
  EXPECT_TRUE(decode_projection_fits(rows, w.get(), fine.in, 1, 64));
  EXPECT_FALSE(decode_projection_fits(gemv_rows(w.get()), w.get(), fine.in, 1, 64));
  EXPECT_FALSE(decode_projection_fits(rows, w.get(), fine.in, kGemvMaxRows + 1, 64));
}

}  // namespace
}  // namespace nsa::cuda
