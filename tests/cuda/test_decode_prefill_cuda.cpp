// Batched GPU prefill (docs/inference.md, "Prefill") against decoding the same prompts token by
// token, on the GPU:
//  - the attention layer: caches filled by NsaDecodeCuda::prefill from packed K/V give every
//    later step bit-identical outputs and selected blocks to caches filled by the append steps
//    (prompts of 1–601 tokens, no multiple of any block size, mapped to shuffled sequences);
//  - the whole decoder: ModelDecoderCuda::prefill of a batch of prompts of different lengths (one
//    a duplicate, in one group or several) then decoding, against one decoder per prompt fed token
//    by token: logits within 3 % of max |logit| (bf16: the prompt's attention runs in the training
//    kernels here, in the decode kernels there, and the GEMMs have other shapes), selected blocks
//    identical but for bf16 near ties;
//  - the errors of a bad prefill.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <random>

#include "../common/test_util.h"
#include "cuda/common/device_buffer.h"
#include "cuda/nsa/nsa_decode.h"
#include "decode/cuda/model_decoder_cuda.h"
#include "nsa/error.h"
#include "nsa/model_config.h"

namespace nsa::test {
namespace {

using cuda::bf16;
using cuda::DeviceBuffer;

// Random bf16 values, n at a time.
std::vector<bf16> random_bf16(int64_t n, std::mt19937& rng, float scale) {
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<bf16> out(static_cast<size_t>(n));
  for (bf16& x : out) x = __float2bfloat16(dist(rng));
  return out;
}

std::vector<uint16_t> bits_of(const DeviceBuffer<bf16>& d) {
  const std::vector<bf16> b = d.download();
  std::vector<uint16_t> out(b.size());
  std::memcpy(out.data(), b.data(), b.size() * sizeof(uint16_t));
  return out;
}

// One prompt's inputs for every position (prompt, then the steps after it): q [T, H, dk], k/v
// per branch [T, G, dk|dv], gates per branch [T, H].
struct SeqInputs {
  std::vector<bf16> q, k[3], v[3], gate[3];
};

SeqInputs random_seq(const NsaConfig& c, int64_t T, std::mt19937& rng) {
  SeqInputs s;
  s.q = random_bf16(T * c.heads * c.dk, rng, 2.0f);
  for (int br = 0; br < 3; ++br) {
    s.k[br] = random_bf16(T * c.groups * c.dk, rng, 1.0f);
    s.v[br] = random_bf16(T * c.groups * c.dv, rng, 1.0f);
    s.gate[br] = random_bf16(T * c.heads, rng, 0.5f);
  }
  return s;
}

struct LayerPrefillCase {
  std::string name;
  NsaConfig cfg;
};

class CudaLayerPrefill : public ::testing::TestWithParam<LayerPrefillCase> {};

TEST_P(CudaLayerPrefill, LaterStepsBitIdenticalToAppendedCaches) {
  const NsaConfig& c = GetParam().cfg;
  const std::vector<int64_t> lengths = {1, 13, 77, 250, 601};
  const std::vector<int32_t> seq_of = {3, 0, 4, 1, 2};  // prompt i fills sequence seq_of[i]
  const int64_t n = static_cast<int64_t>(lengths.size()), extra = 90, H = c.heads, G = c.groups;
  const int64_t max_len = 601 + extra + 1, kw = G * c.dk, vw = G * c.dv;
  std::mt19937 rng(41);
  std::vector<SeqInputs> in;
  for (int64_t S : lengths) in.push_back(random_seq(c, S + extra, rng));
  // The batch, prefilled from the prompts packed back to back.
  cuda::NsaDecodeCuda batch(c, n, max_len, false);
  std::vector<int64_t> cu = {0};
  for (int64_t S : lengths) cu.push_back(cu.back() + S);
  const int64_t T = cu.back();
  std::vector<bf16> packed_k[3], packed_v[3];
  for (int br = 0; br < 3; ++br) {
    for (int64_t i = 0; i < n; ++i) {
      packed_k[br].insert(packed_k[br].end(), in[i].k[br].begin(),
                          in[i].k[br].begin() + lengths[i] * kw);
      packed_v[br].insert(packed_v[br].end(), in[i].v[br].begin(),
                          in[i].v[br].begin() + lengths[i] * vw);
    }
  }
  DeviceBuffer<bf16> pk[3], pv[3];
  for (int br = 0; br < 3; ++br) {
    pk[br].upload(packed_k[br].data(), T * kw);
    pv[br].upload(packed_v[br].data(), T * vw);
  }
  DeviceBuffer<int64_t> cu_dev;
  cu_dev.upload(cu.data(), n + 1);
  DeviceBuffer<int32_t> seq_dev;
  seq_dev.upload(seq_of.data(), n);
  const bf16* pkp[3] = {pk[0].get(), pk[1].get(), pk[2].get()};
  const bf16* pvp[3] = {pv[0].get(), pv[1].get(), pv[2].get()};
  batch.prefill(pkp, pvp, cu_dev.get(), seq_dev.get(), n, 601, nullptr);
  // One decoder per prompt, fed token by token (append), as the reference.
  std::vector<std::unique_ptr<cuda::NsaDecodeCuda>> ref;
  DeviceBuffer<int32_t> pos1(1), posb(n);
  DeviceBuffer<bf16> q1(H * c.dk), o1(H * c.dv), k1[3], v1[3], g1[3];
  for (int br = 0; br < 3; ++br) k1[br].resize(kw), v1[br].resize(vw), g1[br].resize(H);
  const auto step_one = [&](cuda::NsaDecodeCuda& dec, const SeqInputs& s, int64_t t) {
    const int32_t p = static_cast<int32_t>(t);
    pos1.upload(&p, 1);
    q1.upload(s.q.data() + t * H * c.dk, H * c.dk);
    for (int br = 0; br < 3; ++br) {
      k1[br].upload(s.k[br].data() + t * kw, kw);
      v1[br].upload(s.v[br].data() + t * vw, vw);
      g1[br].upload(s.gate[br].data() + t * H, H);
    }
    const bf16* kp[3] = {k1[0].get(), k1[1].get(), k1[2].get()};
    const bf16* vp[3] = {v1[0].get(), v1[1].get(), v1[2].get()};
    const bf16* gp[3] = {g1[0].get(), g1[1].get(), g1[2].get()};
    dec.step(q1.get(), kp, vp, gp, pos1.get(), o1.get(), nullptr);
    NSA_CUDA_CHECK(cudaDeviceSynchronize());
  };
  for (int64_t i = 0; i < n; ++i) {
    ref.push_back(std::make_unique<cuda::NsaDecodeCuda>(c, 1, max_len, false));
    for (int64_t t = 0; t < lengths[i]; ++t) step_one(*ref[i], in[i], t);
  }
  // The steps after the prompts: the batch all at once, each reference alone.
  DeviceBuffer<bf16> qb, kb[3], vb[3], gb[3], ob(n * H * c.dv);
  int64_t compared = 0;
  for (int64_t e = 0; e < extra; ++e) {
    std::vector<int32_t> p(static_cast<size_t>(n));
    std::vector<bf16> q(n * H * c.dk), k[3], v[3], g[3];
    for (int br = 0; br < 3; ++br) k[br].resize(n * kw), v[br].resize(n * vw), g[br].resize(n * H);
    for (int64_t i = 0; i < n; ++i) {
      const int64_t b = seq_of[i], t = lengths[i] + e;
      p[b] = static_cast<int32_t>(t);
      std::copy_n(in[i].q.begin() + t * H * c.dk, H * c.dk, q.begin() + b * H * c.dk);
      for (int br = 0; br < 3; ++br) {
        std::copy_n(in[i].k[br].begin() + t * kw, kw, k[br].begin() + b * kw);
        std::copy_n(in[i].v[br].begin() + t * vw, vw, v[br].begin() + b * vw);
        std::copy_n(in[i].gate[br].begin() + t * H, H, g[br].begin() + b * H);
      }
    }
    posb.upload(p.data(), n);
    qb.upload(q.data(), n * H * c.dk);
    for (int br = 0; br < 3; ++br) {
      kb[br].upload(k[br].data(), n * kw);
      vb[br].upload(v[br].data(), n * vw);
      gb[br].upload(g[br].data(), n * H);
    }
    const bf16* kp[3] = {kb[0].get(), kb[1].get(), kb[2].get()};
    const bf16* vp[3] = {vb[0].get(), vb[1].get(), vb[2].get()};
    const bf16* gp[3] = {gb[0].get(), gb[1].get(), gb[2].get()};
    batch.step(qb.get(), kp, vp, gp, posb.get(), ob.get(), nullptr);
    NSA_CUDA_CHECK(cudaDeviceSynchronize());
    const std::vector<uint16_t> o_batch = bits_of(ob);
    std::vector<int32_t> sel_batch(static_cast<size_t>(n * G * c.n_sel));
    NSA_CUDA_CHECK(cudaMemcpy(sel_batch.data(), batch.selection(),
                              sel_batch.size() * sizeof(int32_t), cudaMemcpyDeviceToHost));
    for (int64_t i = 0; i < n; ++i) {
      const int64_t b = seq_of[i];
      step_one(*ref[i], in[i], lengths[i] + e);
      const std::vector<uint16_t> o_ref = bits_of(o1);
      ASSERT_TRUE(std::equal(o_ref.begin(), o_ref.end(), o_batch.begin() + b * H * c.dv))
          << "output of prompt " << i << " (" << lengths[i] << " tokens), step " << e;
      std::vector<int32_t> sel_ref(static_cast<size_t>(G * c.n_sel));
      NSA_CUDA_CHECK(cudaMemcpy(sel_ref.data(), ref[i]->selection(),
                                sel_ref.size() * sizeof(int32_t), cudaMemcpyDeviceToHost));
      ASSERT_TRUE(std::equal(sel_ref.begin(), sel_ref.end(), sel_batch.begin() + b * G * c.n_sel))
          << "selected blocks of prompt " << i << ", step " << e;
      ++compared;
    }
  }
  std::printf(
      "[ %s ] %lld steps after prompts of 1–601 tokens: outputs and selections "
      "bit-identical\n",
      GetParam().name.c_str(), static_cast<long long>(compared));
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, CudaLayerPrefill,
    ::testing::Values(LayerPrefillCase{"tiny", make_config({4, 2, 16, 16}, {16, 8, 32, 4, 64})},
                      LayerPrefillCase{"m7c", make_config({12, 2, 64, 64}, {32, 16, 64, 16, 512})},
                      LayerPrefillCase{"wide", make_config({16, 1, 32, 48}, {32, 16, 128, 3, 96})}),
    [](const ::testing::TestParamInfo<LayerPrefillCase>& i) { return i.param.name; });

ModelConfig tiny_model(const std::map<std::string, std::string>& overrides) {
  ModelConfig cfg = load_model_config(std::string(NSA_SOURCE_DIR) + "/configs/tiny.yaml");
  for (const auto& [k, v] : overrides) set_model_field(cfg, k, v);
  cfg.validate();
  return cfg;
}

ModelParams<float> sharp_params(const ModelConfig& cfg) {
  ModelParams<float> params = init_model_params<float>(cfg);
  for (auto& layer : params.layers) {  // sharper attention: selections are decided, not tied
    for (float& x : layer.wq.data) x *= 6.0f;
    for (auto& wk : layer.wk)
      for (float& x : wk.data) x *= 6.0f;
  }
  return params;
}

class CudaPrefill : public ::testing::TestWithParam<std::map<std::string, std::string>> {};

TEST_P(CudaPrefill, PrefillThenDecodeMatchesDecodingTokenByToken) {
  const ModelConfig cfg = tiny_model(GetParam());
  const ModelParams<float> params = sharp_params(cfg);
  const NsaConfig& a = cfg.attn;
  const int64_t V = cfg.vocab_size, G = a.groups, extra = 40;
  // l = 16, d = 8, l_sel = 32, w = 64: no length is a multiple of any; prompt 4 repeats prompt 2.
  const std::vector<int64_t> lengths = {1, 37, 100, 261, 100};
  const int64_t B = static_cast<int64_t>(lengths.size()), max_len = 261 + extra + 1;
  std::mt19937 rng(7);
  std::uniform_int_distribution<int32_t> tok(0, static_cast<int32_t>(V - 1));
  std::vector<std::vector<int32_t>> prompts;
  for (int64_t S : lengths) {
    std::vector<int32_t> p(static_cast<size_t>(S));
    for (auto& t : p) t = tok(rng);
    prompts.push_back(p);
  }
  prompts[4] = prompts[2];
  std::vector<std::vector<int32_t>> next(static_cast<size_t>(extra));
  for (auto& row : next) {
    row.resize(static_cast<size_t>(B));
    for (auto& t : row) t = tok(rng);
  }
  // The reference: one decoder per prompt, prompt and continuation token by token.
  std::vector<std::unique_ptr<cuda::ModelDecoderCuda>> ref;
  std::vector<std::vector<float>> ref_logits(static_cast<size_t>(B));
  for (int64_t b = 0; b < B; ++b) {
    ref.push_back(std::make_unique<cuda::ModelDecoderCuda>(cfg, params, 1, max_len, false));
  }
  const auto close = [&](const std::vector<float>& want, const float* got, double& worst) {
    float mx = 0, err = 0;
    for (int64_t i = 0; i < V; ++i) {
      mx = std::max(mx, std::fabs(want[i]));
      err = std::max(err, std::fabs(want[i] - got[i]));
    }
    const float tol = 0.03f * mx + 1e-3f;
    worst = std::max(worst, static_cast<double>(err / tol));
    return err <= tol;
  };
  // Budget 150: prompts 0–2 in one forward (138 tokens), 3 alone, 4 copies 2; the default: all
  // distinct prompts in one forward.
  for (const int64_t budget : {int64_t{150}, cuda::ModelDecoderCuda::kPrefillTokenBudget}) {
    for (int64_t b = 0; b < B; ++b) {
      ref[b]->reset();
      for (int32_t t : prompts[b]) ref_logits[b] = ref[b]->step({t});
    }
    cuda::ModelDecoderCuda dec(cfg, params, B, max_len, false);
    const std::vector<float> first = dec.prefill(prompts, budget);
    EXPECT_EQ(dec.lengths(), lengths);
    double worst = 0;
    for (int64_t b = 0; b < B; ++b) {
      ASSERT_TRUE(close(ref_logits[b], first.data() + b * V, worst))
          << "logits after prompt " << b << " (" << lengths[b] << " tokens), budget " << budget;
    }
    // The duplicate's caches are a copy: its logits equal its source's bit for bit.
    ASSERT_TRUE(std::equal(first.begin() + 2 * V, first.begin() + 3 * V, first.begin() + 4 * V));
    int64_t sets = 0, differ = 0;
    for (int64_t e = 0; e < extra; ++e) {
      const std::vector<float> lg = dec.step(next[e]);
      for (int64_t b = 0; b < B; ++b) {
        ref_logits[b] = ref[b]->step({next[e][b]});
        ASSERT_TRUE(close(ref_logits[b], lg.data() + b * V, worst))
            << "step " << e << " after prompt " << b << ", budget " << budget;
      }
      for (int64_t li = 0; li < cfg.n_layers; ++li) {
        const std::vector<int32_t> sg = dec.selection(li);
        for (int64_t b = 0; b < B; ++b) {
          const std::vector<int32_t> sr = ref[b]->selection(li);
          for (int64_t g = 0; g < G; ++g) {
            ++sets;
            differ += std::equal(sr.begin() + g * a.n_sel, sr.begin() + (g + 1) * a.n_sel,
                                 sg.begin() + (b * G + g) * a.n_sel)
                          ? 0
                          : 1;
          }
        }
      }
    }
    std::printf(
        "[ prefill, budget %lld ] %lld prompts, %lld steps: worst |Δlogit| / tol %.3f; "
        "selection sets that differ %lld of %lld\n",
        static_cast<long long>(budget), static_cast<long long>(B), static_cast<long long>(extra),
        worst, static_cast<long long>(differ), static_cast<long long>(sets));
    EXPECT_LE(differ * 20, sets) << "more than 5 % of the selections differ";
    // reset() and the same prefill again: the same logits, bit for bit.
    dec.reset();
    EXPECT_EQ(dec.prefill(prompts, budget), first);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Variants, CudaPrefill,
    ::testing::Values(std::map<std::string, std::string>{},
                      std::map<std::string, std::string>{{"kv", "shared"}, {"gate", "softmax"}},
                      std::map<std::string, std::string>{{"branches", "sel,win"}, {"mlp", "silu"}},
                      // docs/quality.md: the prefill's window covers the
                      // longest prompt, the decoder's the caches.
                      std::map<std::string, std::string>{{"attention", "full"}},
                      std::map<std::string, std::string>{{"attention", "window"}, {"w", "32"}}));

TEST(CudaPrefillErrors, BadPrefillsAreRejected) {
  const ModelConfig cfg = tiny_model({});
  const ModelParams<float> params = init_model_params<float>(cfg);
  const int32_t V = static_cast<int32_t>(cfg.vocab_size);
  cuda::ModelDecoderCuda dec(cfg, params, 2, 8, false);
  EXPECT_THROW(dec.prefill({{1, 2}}), Error);                               // one prompt for two
  EXPECT_THROW(dec.prefill({{1, 2}, {}}), Error);                           // empty
  EXPECT_THROW(dec.prefill({{1, 2}, {1, 2, 3, 4, 5, 6, 7, 8, 9}}), Error);  // 9 > 8 tokens
  EXPECT_THROW(dec.prefill({{1, 2}, {3, V}}), Error);  // outside the vocabulary
  EXPECT_EQ(dec.position(), 0);
  dec.prefill({{1, 2}, {3, 4, 5}});
  EXPECT_THROW(dec.prefill({{1, 2}, {3, 4, 5}}), Error);  // not fresh
  dec.step({1, 1});
  EXPECT_EQ(dec.lengths(), (std::vector<int64_t>{3, 4}));
  cuda::ModelDecoderCuda dense(cfg, params, 1, 8, true);
  EXPECT_THROW(dense.prefill({{1, 2}}), Error);
}

}  // namespace
}  // namespace nsa::test
