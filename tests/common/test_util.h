// Shared helpers for the tests: config construction and tolerance checks that print headroom.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>

#include <cmath>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "nsa/attention.h"
#include "nsa/error.h"
#include "nsa/model_config.h"

namespace nsa::test {

struct Shape5 {
  int64_t H, G, dk, dv;
};
struct Hyper {
  int64_t l, d, l_sel, n_sel, w;
};

// One parameterised test shape: names the case, the attention shape and hyper-parameters, and
// the sequence layout.
struct NsaCase {
  const char* name;
  Shape5 shape;
  Hyper hyper;
  Phi phi;
  KvMode kv;
  std::vector<int64_t> cu_seqlens;
};

inline NsaConfig make_config(Shape5 s, Hyper p, Phi phi = Phi::kAvg,
                             KvMode kv = KvMode::kSeparate) {
  NsaConfig cfg;
  cfg.heads = s.H, cfg.groups = s.G, cfg.dk = s.dk, cfg.dv = s.dv;
  cfg.l = p.l, cfg.d = p.d, cfg.l_sel = p.l_sel, cfg.n_sel = p.n_sel, cfg.w = p.w;
  cfg.phi = phi, cfg.kv = kv;
  cfg.validate();
  return cfg;
}

// The message of the nsa::Error that f() throws; "" when it throws none.
template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// (field, value) pairs in set_model_field's names and value syntax.
using ModelFields = std::vector<std::pair<std::string, std::string>>;

inline void set_model_fields(ModelConfig& c, const ModelFields& fields) {
  for (const auto& [k, v] : fields) set_model_field(c, k, v);
}

// The small test models' second variant: every option at its other value – SiLU MLP, shared K/V,
// φ mlp, softmax gates, untied embeddings.
inline const ModelFields& other_options() {
  static const ModelFields fields = {{"mlp", "silu"},
                                     {"kv", "shared"},
                                     {"phi", "mlp"},
                                     {"gate", "softmax"},
                                     {"tie_embeddings", "false"}};
  return fields;
}

// The small model the CPU decoding tests step (2 layers, dim 24, H 4, G 2; l 8, d 4, l_sel 8,
// n_sel 5, w 11 – no block size a multiple of another's). `second`: other_options().
inline ModelConfig tiny_decode_model(bool second) {
  ModelConfig c;
  set_model_fields(c, {{"vocab_size", "37"},
                       {"dim", "24"},
                       {"n_layers", "2"},
                       {"seq_len", "96"},
                       {"heads", "4"},
                       {"groups", "2"},
                       {"dk", "6"},
                       {"dv", "6"},
                       {"l", "8"},
                       {"d", "4"},
                       {"l_sel", "8"},
                       {"n_sel", "5"},
                       {"w", "11"},
                       {"init_std", "0.25"}});
  if (second) set_model_fields(c, other_options());
  c.validate();
  return c;
}

// A temp-file path unique per test and process (CTest runs tests in parallel).
inline std::string unique_temp_path(const std::string& name) {
  const std::string test = ::testing::UnitTest::GetInstance()->current_test_info()->name();
  return (std::filesystem::temp_directory_path() /
          ("nsa_test_" + test + "_" + std::to_string(getpid()) + "_" + name))
      .string();
}

// |a - b| <= atol + rtol·|b| elementwise; reports the worst element and the headroom
// (tolerance / worst error) so a passing test shows how close it came.
template <typename A, typename B>
void expect_close(const Tensor<A>& a, const Tensor<B>& b, double atol, double rtol,
                  const std::string& what) {
  ASSERT_EQ(a.shape, b.shape) << what;
  double worst_ratio = 0, worst_err = 0;
  int64_t worst_i = -1;
  for (int64_t i = 0; i < a.numel(); ++i) {
    const double x = static_cast<double>(a[i]), y = static_cast<double>(b[i]);
    if (std::isinf(x) && x == y) continue;  // e.g. the log-sum-exp of an empty branch
    ASSERT_TRUE(std::isfinite(x)) << what << "[" << i << "] is " << x << ", expected " << y;
    const double err = std::fabs(x - y), tol = atol + rtol * std::fabs(y);
    if (err / tol > worst_ratio) worst_ratio = err / tol, worst_err = err, worst_i = i;
  }
  EXPECT_LE(worst_ratio, 1.0) << what << ": worst element " << worst_i << " differs by "
                              << worst_err << " (" << worst_ratio << "x the tolerance)";
  std::printf("  %-28s max err %.3e, headroom %.1fx\n", what.c_str(), worst_err,
              worst_ratio > 0 ? 1.0 / worst_ratio : INFINITY);
}

// The same inputs in another precision (absent tensors stay absent).
template <typename To, typename From>
NsaTensors<To> cast_tensors(const NsaTensors<From>& in) {
  NsaTensors<To> out;
  out.q = in.q.template cast<To>();
  for (int b = 0; b < kNumBranches; ++b) {
    out.k[b] = in.k[b].template cast<To>();
    out.v[b] = in.v[b].template cast<To>();
    out.gate[b] = in.gate[b].template cast<To>();
  }
  for (auto [dst, src] : {std::pair{&out.phi_k, &in.phi_k}, std::pair{&out.phi_v, &in.phi_v}}) {
    dst->pos = src->pos.template cast<To>();
    dst->w1 = src->w1.template cast<To>();
    dst->b1 = src->b1.template cast<To>();
    dst->w2 = src->w2.template cast<To>();
    dst->b2 = src->b2.template cast<To>();
  }
  return out;
}

template <typename T>
void expect_equal(const Tensor<T>& a, const Tensor<T>& b, const std::string& what) {
  ASSERT_EQ(a.shape, b.shape) << what;
  for (int64_t i = 0; i < a.numel(); ++i) {
    ASSERT_EQ(a[i], b[i]) << what << " differs at element " << i;
  }
}

}  // namespace nsa::test
