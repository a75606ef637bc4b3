// GPU decoding against the CPU: the NSA decode layer (and its dense baseline) step by step on
// random bf16 inputs against NsaDecodeCache / a plain softmax, over lengths that cross the window,
// many compressed emissions and selection blocks; then the whole decoder's logits and selected
// blocks against the CPU ModelDecoder.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <random>

#include "../common/test_util.h"
#include "cuda/common/device_buffer.h"
#include "cuda/device.h"
#include "cuda/nsa/decode_chunks.h"
#include "cuda/nsa/nsa_decode.h"
#include "decode/cuda/model_decoder_cuda.h"
#include "decode/model_decoder.h"
#include "decode/nsa_decode_cache.h"
#include "model/cuda/gemv.h"
#include "model/cuda/skinny_gemm.h"

namespace nsa::test {
namespace {

using cuda::bf16;
using cuda::DeviceBuffer;

float round_bf16(float x) {
  return __bfloat162float(__float2bfloat16(x));
}

// Random values already representable in bf16, as floats (CPU) and bf16 (GPU).
struct Bf16Input {
  std::vector<float> host;
  DeviceBuffer<bf16> dev;
  // n values from draw(), rounded to bf16, kept on both sides.
  template <class Draw>
  void fill_with(int64_t n, Draw&& draw) {
    host.resize(static_cast<size_t>(n));
    std::vector<bf16> b(host.size());
    for (size_t i = 0; i < host.size(); ++i) {
      host[i] = round_bf16(draw());
      b[i] = __float2bfloat16(host[i]);
    }
    dev.upload(b.data(), n);
  }
  void fill(int64_t n, std::mt19937& rng, float scale) {
    std::normal_distribution<float> dist(0.0f, scale);
    fill_with(n, [&] { return dist(rng); });
  }
  // Quarter integers in [−1, 1]: any average of up to 64 of them is exact in bf16, so compressed
  // tokens (φ = avg) are the same on the GPU (bf16 cache) as on the CPU (fp32).
  void fill_grid(int64_t n, std::mt19937& rng) {
    std::uniform_int_distribution<int> dist(-4, 4);
    fill_with(n, [&] { return static_cast<float>(dist(rng)) / 4.0f; });
  }
};

std::vector<float> to_float(const DeviceBuffer<bf16>& d) {
  const std::vector<bf16> b = d.download();
  std::vector<float> f(b.size());
  for (size_t i = 0; i < b.size(); ++i) f[i] = __bfloat162float(b[i]);
  return f;
}

struct LayerCase {
  std::string name;
  NsaConfig cfg;
  int64_t batch, steps;
  int64_t max_len = 0;  // the caches' capacity (0: steps); it sets the block top-n chunk size
  // Whether both kernels' rows must come as TMA boxes (false: the shape takes the 16-byte copies);
  // asserted, so that a change of the choice cannot leave a path untested.
  bool tma_rows = false;
};

// The rows' paths the constructor chose (the shape's, at every batch), against the case's.
// m7c's tile, on either path, leaves room for six parts CTAs an SM (the kernel's launch bounds;
// the copy engine's alignment slack once cost one of them).
void expect_rows_path(const cuda::NsaDecodeCuda& gpu, bool tma_rows) {
  EXPECT_EQ(gpu.parts_rows_by_tma(), tma_rows) << "the parts' rows path";
  EXPECT_EQ(gpu.picks_rows_by_tma(), tma_rows) << "the picks' rows path";
  if (tma_rows) {
    EXPECT_EQ(gpu.parts_ctas_per_sm(), 6) << "parts CTAs an SM: " << gpu.plan();
  }
}

// Whether the compressed parts left the top-n block sums (decode_params.cuh) – the shapes whose
// scores are narrow (d_k = d_v = 64, at most 8 heads a group) with l = 2d and l_sel = 4d, as m7c's
// – or every score: both paths are taken by the cases below, and a change of the choice is caught.
void expect_selection_path(const cuda::NsaDecodeCuda& gpu, const NsaConfig& c) {
  const bool sums =
      c.dk == 64 && c.dv == 64 && c.heads_per_group() <= 8 && c.l == 2 * c.d && c.l_sel == 4 * c.d;
  EXPECT_EQ(gpu.selection_by_block_sums(), sums) << "the top-n's inputs: block sums or scores";
}

// Branch br's K and V (nk / nv values): the compressed branch's on the quarter grid (exact
// averages: selections can differ only at fp32 near ties), the others normal.
void fill_kv(Bf16Input& k, Bf16Input& v, int br, int64_t nk, int64_t nv, std::mt19937& rng) {
  if (br == kCmp) {
    k.fill_grid(nk, rng);
    v.fill_grid(nv, rng);
  } else {
    k.fill(nk, rng, 1.0f);
    v.fill(nv, rng, 1.0f);
  }
}

// One decode step on fresh inputs for B sequences: q (spread scores, so that the selection is
// decided, not tied), every branch's K/V (kw / vw values per sequence; the compressed branch's
// exact in bf16, so that selections can differ only at fp32 near ties) and gates, run on the GPU.
struct RandomStep {
  const NsaConfig& c;
  int64_t kw, vw;
  Bf16Input q, k[3], v[3], gate[3];
  std::vector<float> o;      // the GPU's output, B·H·dv
  std::vector<int32_t> sel;  // the GPU's selection, B·G·n_sel

  RandomStep(cuda::NsaDecodeCuda& gpu, const NsaConfig& cfg, int64_t B, int64_t k_width,
             int64_t v_width, const int32_t* pos, DeviceBuffer<bf16>& o_dev, std::mt19937& rng)
      : c(cfg), kw(k_width), vw(v_width) {
    q.fill(B * c.heads * c.dk, rng, 2.0f);
    for (int br = 0; br < 3; ++br) {
      fill_kv(k[br], v[br], br, B * kw, B * vw, rng);
      gate[br].fill(B * c.heads, rng, 0.5f);
    }
    const bf16* kp[3] = {k[0].dev.get(), k[1].dev.get(), k[2].dev.get()};
    const bf16* vp[3] = {v[0].dev.get(), v[1].dev.get(), v[2].dev.get()};
    const bf16* gp[3] = {gate[0].dev.get(), gate[1].dev.get(), gate[2].dev.get()};
    gpu.step(q.dev.get(), kp, vp, gp, pos, o_dev.get(), nullptr);
    NSA_CUDA_CHECK(cudaDeviceSynchronize());
    o = to_float(o_dev);
    sel.resize(static_cast<size_t>(B * c.groups * c.n_sel));
    NSA_CUDA_CHECK(cudaMemcpy(sel.data(), gpu.selection(), sel.size() * sizeof(int32_t),
                              cudaMemcpyDeviceToHost));
  }

  // Sequence b's step on a CPU cache: its output (H·dv) and selection (G·n_sel).
  struct Cpu {
    std::vector<float> o;
    std::vector<int32_t> sel;
  };
  Cpu cpu_step(NsaDecodeCache& cache, int64_t b) const {
    Cpu r{std::vector<float>(static_cast<size_t>(c.heads * c.dv)),
          std::vector<int32_t>(static_cast<size_t>(c.groups * c.n_sel))};
    const float* kb[3];
    const float* vb[3];
    const float* gb[3];
    for (int br = 0; br < 3; ++br) {
      kb[br] = k[br].host.data() + b * kw;
      vb[br] = v[br].host.data() + b * vw;
      gb[br] = gate[br].host.data() + b * c.heads;
    }
    cache.step(q.host.data() + b * c.heads * c.dk, kb, vb, gb, nullptr, nullptr, r.o.data(),
               r.sel.data());
    return r;
  }
};

class CudaDecodeLayer : public ::testing::TestWithParam<LayerCase> {};

// Every step: o within 2^-7·max|o| + 1e-3 of the CPU cache (bf16 output and compressed tokens);
// the selected blocks identical but for fp32 near ties (≤ 0.5 % of (step, sequence, group) sets;
// the compressed branch's K/V are exact in bf16, so the GPU and CPU score the same tokens).
TEST_P(CudaDecodeLayer, NsaMatchesTheCpuCacheStepByStep) {
  const LayerCase& lc = GetParam();
  const NsaConfig& c = lc.cfg;
  const int64_t B = lc.batch, H = c.heads, G = c.groups;
  cuda::NsaDecodeCuda gpu(c, B, std::max(lc.steps, lc.max_len), false);
  expect_rows_path(gpu, lc.tma_rows);
  expect_selection_path(gpu, c);
  std::vector<NsaDecodeCache> cpu(static_cast<size_t>(B), NsaDecodeCache(c));
  DeviceBuffer<int32_t> pos(B);
  DeviceBuffer<bf16> o(B * H * c.dv);
  std::mt19937 rng(17);
  int64_t sel_sets = 0, sel_diff = 0;
  double worst = 0;
  for (int64_t t = 0; t < lc.steps; ++t) {
    const std::vector<int32_t> p(static_cast<size_t>(B), static_cast<int32_t>(t));
    pos.upload(p.data(), B);
    const RandomStep st(gpu, c, B, G * c.dk, G * c.dv, pos.get(), o, rng);
    const std::vector<float>& og = st.o;
    const std::vector<int32_t>& sel_gpu = st.sel;
    for (int64_t b = 0; b < B; ++b) {
      const RandomStep::Cpu ref = st.cpu_step(cpu[b], b);
      const std::vector<float>& oc = ref.o;
      const std::vector<int32_t>& sc = ref.sel;
      float mx = 0, err = 0;
      for (size_t i = 0; i < oc.size(); ++i) {
        mx = std::max(mx, std::fabs(oc[i]));
        err = std::max(err, std::fabs(oc[i] - og[b * H * c.dv + i]));
      }
      const float tol = mx / 128.0f + 1e-3f;
      worst = std::max(worst, static_cast<double>(err / tol));
      for (int64_t g = 0; g < G; ++g) {
        ++sel_sets;
        bool same = true;
        for (int64_t j = 0; j < c.n_sel; ++j)
          same = same && sc[g * c.n_sel + j] == sel_gpu[(b * G + g) * c.n_sel + j];
        sel_diff += same ? 0 : 1;
      }
      // A selection difference changes o legitimately; judge o only where the sets agree.
      bool all_same = true;
      for (int64_t g = 0; g < G; ++g) {
        for (int64_t j = 0; j < c.n_sel; ++j)
          all_same = all_same && sc[g * c.n_sel + j] == sel_gpu[(b * G + g) * c.n_sel + j];
      }
      if (all_same) {
        ASSERT_LE(err, tol) << "step " << t << " sequence " << b << " (max |o| " << mx << ")";
      }
    }
  }
  std::printf(
      "[ %s ] %lld steps × %lld sequences: worst |Δo| / tol %.3f; selection sets that "
      "differ %lld of %lld\n",
      lc.name.c_str(), static_cast<long long>(lc.steps), static_cast<long long>(B), worst,
      static_cast<long long>(sel_diff), static_cast<long long>(sel_sets));
  EXPECT_LE(sel_diff * 200, sel_sets) << "more than 0.5 % of the selections differ";
}

// The dense baseline: softmax over every cached key of the selected branch, per head.
TEST_P(CudaDecodeLayer, DenseMatchesPlainSoftmax) {
  const LayerCase& lc = GetParam();
  const NsaConfig& c = lc.cfg;
  const int64_t B = lc.batch, H = c.heads, G = c.groups, hpg = H / G;
  cuda::NsaDecodeCuda gpu(c, B, std::max(lc.steps, lc.max_len), true);
  DeviceBuffer<int32_t> pos(B);
  DeviceBuffer<bf16> o(B * H * c.dv);
  std::mt19937 rng(23);
  // Per sequence, every step's K and V ([t][G][d]), appended as the decoder's cache is.
  std::vector<std::vector<float>> kc(static_cast<size_t>(B)), vc(static_cast<size_t>(B));
  const float scale = static_cast<float>(c.softmax_scale());
  double worst = 0;
  for (int64_t t = 0; t < lc.steps; ++t) {
    const std::vector<int32_t> p(static_cast<size_t>(B), static_cast<int32_t>(t));
    pos.upload(p.data(), B);
    Bf16Input q, k, v;
    q.fill(B * H * c.dk, rng, 1.0f);
    k.fill(B * G * c.dk, rng, 1.0f);
    v.fill(B * G * c.dv, rng, 1.0f);
    const int ks = static_cast<int>(c.kv_index(kSel));
    const bf16* kp[3] = {nullptr, nullptr, nullptr};
    const bf16* vp[3] = {nullptr, nullptr, nullptr};
    const bf16* gp[3] = {nullptr, nullptr, nullptr};
    kp[ks] = k.dev.get();
    vp[ks] = v.dev.get();
    gpu.step(q.dev.get(), kp, vp, gp, pos.get(), o.get(), nullptr);
    NSA_CUDA_CHECK(cudaDeviceSynchronize());
    const std::vector<float> og = to_float(o);
    for (int64_t b = 0; b < B; ++b) {
      kc[b].insert(kc[b].end(), k.host.begin() + b * G * c.dk, k.host.begin() + (b + 1) * G * c.dk);
      vc[b].insert(vc[b].end(), v.host.begin() + b * G * c.dv, v.host.begin() + (b + 1) * G * c.dv);
      for (int64_t h = 0; h < H; ++h) {
        const int64_t g = h / hpg;
        std::vector<double> s(static_cast<size_t>(t + 1));
        double mx = -1e30, sum = 0;
        for (int64_t r = 0; r <= t; ++r) {
          double a = 0;
          for (int64_t i = 0; i < c.dk; ++i)
            a +=
                static_cast<double>(q.host[(b * H + h) * c.dk + i]) * kc[b][(r * G + g) * c.dk + i];
          s[r] = a * scale;
          mx = std::max(mx, s[r]);
        }
        for (double& x : s) sum += (x = std::exp(x - mx));
        for (int64_t e = 0; e < c.dv; ++e) {
          double ref = 0, mass = 0;  // mass: Σ p·|v|, what bf16 rounding of P can move
          for (int64_t r = 0; r <= t; ++r) {
            const double pv = s[r] / sum * vc[b][(r * G + g) * c.dv + e];
            ref += pv, mass += std::fabs(pv);
          }
          const double err = std::fabs(ref - og[(b * H + h) * c.dv + e]);
          // The kernel rounds o to bf16 and, as the training forward does, P to bf16 before P·V
          // (relative 2^-9 each): twice that model, plus a floor for the fp32 sums.
          const double tol = std::fabs(ref) / 128.0 + mass / 256.0 + 2e-3;
          worst = std::max(worst, err / tol);
          ASSERT_LE(err, tol) << "step " << t << " sequence " << b << " head " << h;
        }
      }
    }
  }
  std::printf("[ %s dense ] worst |Δo| / tol %.3f\n", lc.name.c_str(), worst);
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, CudaDecodeLayer,
    ::testing::Values(
        // tiny's attention, lengths far past w, with many emissions and blocks.
        LayerCase{"tiny", make_config({4, 2, 16, 16}, {16, 8, 32, 4, 64}), 2, 333},
        // m7c's attention (hpg 6, dk 64), B = 1, many compressed emissions; both kernels' rows
        // come by TMA boxes (the picks' with the row at t put in from the inputs; the shapes
        // without tma_rows: cp.async).
        LayerCase{"m7c", make_config({12, 2, 64, 64}, {32, 16, 64, 16, 512}), 1, 700, 0, true},
        // m7c's branches with 8 heads a group (the most the narrow scores take: heads 2·tq + 1 = 7
        // of the last column), B = 2: both kernels' rows by TMA.
        LayerCase{"heads8", make_config({16, 2, 64, 64}, {32, 16, 64, 16, 512}), 2, 300, 0, true},
        // m7c's attention at B = 16 (the benchmark's batch): both kernels' rows by TMA (16 × 2 × 6
        // parts CTAs, 16 × 2 × 8 picks CTAs) at map rows (b·G + g)·rows + r.
        LayerCase{"m7c_b16", make_config({12, 2, 64, 64}, {32, 16, 64, 16, 512}), 16, 300, 700,
                  true},
        // d_k = d_v = 64 with 16 heads in one group: the 16-row scores (hpg > 8), compiled dims.
        LayerCase{"heads16", make_config({16, 1, 64, 64}, {32, 16, 64, 16, 512}), 1, 300},
        // l_sel = 128 (one block per 128-key part), dv ≠ dk, one group of 16 heads, n_sel = 3
        // (nothing to pick: the picks kernel only combines).
        LayerCase{"wide", make_config({16, 1, 32, 48}, {32, 16, 128, 3, 96}), 3, 420},
        // l_sel = 256: each block split over two 128-key parts, forced and picked; a window of
        // 160 in a full and a partial part.
        LayerCase{"long_blocks", make_config({8, 2, 32, 32}, {32, 16, 256, 5, 160}), 2, 1600},
        // Small blocks, long: 299 compressed tokens (3 compressed parts, pre-merged per head), 150
        // blocks (3 block top-n chunks whose candidates are merged), 16 blocks per selected part.
        LayerCase{"long", make_config({4, 1, 16, 16}, {8, 4, 8, 6, 32}), 2, 1200},
        // The same with caches for 60,000 tokens: block top-n chunks of 256 blocks, whose 514
        // compressed tokens take every path of the staging (two per thread, then the rest); 549
        // compressed tokens in 5 parts at the end.
        LayerCase{"long_chunks", make_config({4, 1, 16, 16}, {8, 4, 8, 6, 32}), 1, 2200, 60000},
        // More picks parts than a cluster holds: l_sel = 128 (one block per part), n_sel = 12 –
        // 2 forced + 9 picked parts over the picks kernel's 8 CTAs, two parts for some of them.
        LayerCase{"many_parts", make_config({4, 2, 32, 32}, {32, 16, 128, 12, 128}), 2, 1800},
        // Many picks: n_sel = 48 on 16-token blocks – up to 45 picks of 91 candidates in two
        // top-n chunks, more kept candidates than the merge's warp has lanes (its rank loop and the
        // ascending write take two rounds, a list's kept entries several load batches), 8 blocks a
        // selected part.
        LayerCase{"many_picks", make_config({4, 2, 16, 16}, {16, 8, 16, 48, 64}), 2, 1500},
        // Large heads: dk 192, dv 256 (twelve k-steps of the score MMAs, sixteen value column
        // tiles; a part's tile takes 135 KiB of shared memory).
        LayerCase{"deep", make_config({4, 2, 192, 256}, {16, 8, 32, 4, 64}), 1, 700},
        // One picks CTA (a single late part, n_sel = 3) for a group of 16 heads with dv = 64: the
        // combine's 256 outputs take two passes of the CTA (one split, a thread per output).
        LayerCase{"one_cta", make_config({16, 1, 16, 64}, {16, 8, 32, 3, 32}), 2, 500}),
    [](const ::testing::TestParamInfo<LayerCase>& i) { return i.param.name; });

// m7c's attention with caches for `capacity` tokens filled by prefill on both sides (the GPU's
// NsaDecodeCuda::prefill, the CPU's NsaDecodeCache::prefill) to `lengths`, then `steps` steps on
// fresh inputs. Same checks as the shapes above: o within 2^-7·max|o| + 1e-3, selections
// identical but for fp32 near ties. Both kernels' rows come by TMA (m7c's shape,
// expect_rows_path); the top-n takes `chunking`.
void expect_prefilled_matches_cpu(const std::vector<int64_t>& lengths, int64_t capacity,
                                  int64_t steps, cuda::decode::TopkChunks chunking) {
  const NsaConfig c = make_config({12, 2, 64, 64}, {32, 16, 64, 16, 512});
  const int64_t B = static_cast<int64_t>(lengths.size()), H = c.heads, G = c.groups;
  const int64_t kw = G * c.dk, vw = G * c.dv;
  cuda::NsaDecodeCuda gpu(c, B, capacity, false);
  expect_rows_path(gpu, true);
  EXPECT_TRUE(gpu.selection_by_block_sums());
  EXPECT_EQ(gpu.topk_chunk(), chunking.chunk) << "candidate blocks a top-n chunk";
  // At most two picks CTAs an SM only where the rule wants it for their grid (8 CTAs a (sequence,
  // group) for m7c; decode_chunks.h, checked on the CPU) – and there only if every cluster fits
  // at once, which the runtime decides (NsaDecodeCuda::spread_picks).
  const int64_t sms = cuda::current_sm_count();
  if (!cuda::decode::picks_spread_wanted(B * G * 8, sms)) {
    EXPECT_FALSE(gpu.picks_spread());
  } else if (sms == 132) {
    // On an H100's or H200's 132 SMs every cluster fits at two CTAs an SM (each run since the
    // thirty-eighth session printed "spread"), so there the spread must apply.
    EXPECT_TRUE(gpu.picks_spread()) << gpu.plan();
  }
  std::printf("[ long ] on %lld SMs: %s\n", static_cast<long long>(sms), gpu.plan().c_str());
  const int64_t longest = *std::max_element(lengths.begin(), lengths.end());
  std::vector<NsaDecodeCache> cpu(static_cast<size_t>(B), NsaDecodeCache(c));
  std::mt19937 rng(29);
  // The prompts' K/V per branch, packed back to back on the GPU, one tensor per prompt on the CPU;
  // the compressed branch's on the quarter grid (exact averages, as above).
  std::vector<int64_t> cu = {0};
  for (int64_t S : lengths) cu.push_back(cu.back() + S);
  const int64_t T = cu.back();
  Bf16Input pk[3], pv[3];
  for (int br = 0; br < 3; ++br) fill_kv(pk[br], pv[br], br, T * kw, T * vw, rng);
  for (int64_t b = 0; b < B; ++b) {
    Tensor<float> k[3], v[3];
    for (int br = 0; br < 3; ++br) {
      k[br] = Tensor<float>({lengths[b], G, c.dk});
      v[br] = Tensor<float>({lengths[b], G, c.dv});
      std::copy_n(pk[br].host.begin() + cu[b] * kw, lengths[b] * kw, k[br].data.begin());
      std::copy_n(pv[br].host.begin() + cu[b] * vw, lengths[b] * vw, v[br].data.begin());
    }
    cpu[b].prefill(k, v, nullptr, nullptr);
  }
  DeviceBuffer<int64_t> cu_dev;
  cu_dev.upload(cu.data(), B + 1);
  std::vector<int32_t> seqs;  // each prompt its own sequence
  for (int64_t b = 0; b < B; ++b) seqs.push_back(static_cast<int32_t>(b));
  DeviceBuffer<int32_t> seq_dev;
  seq_dev.upload(seqs.data(), B);
  const bf16* pkp[3] = {pk[0].dev.get(), pk[1].dev.get(), pk[2].dev.get()};
  const bf16* pvp[3] = {pv[0].dev.get(), pv[1].dev.get(), pv[2].dev.get()};
  gpu.prefill(pkp, pvp, cu_dev.get(), seq_dev.get(), B, longest, nullptr);
  DeviceBuffer<int32_t> pos(B);
  DeviceBuffer<bf16> o(B * H * c.dv);
  int64_t sel_sets = 0, sel_diff = 0;
  double worst = 0;
  for (int64_t e = 0; e < steps; ++e) {
    std::vector<int32_t> p(static_cast<size_t>(B));
    for (int64_t b = 0; b < B; ++b) p[b] = static_cast<int32_t>(lengths[b] + e);
    pos.upload(p.data(), B);
    const RandomStep st(gpu, c, B, kw, vw, pos.get(), o, rng);
    const std::vector<float>& og = st.o;
    const std::vector<int32_t>& sel_gpu = st.sel;
    for (int64_t b = 0; b < B; ++b) {
      const RandomStep::Cpu ref = st.cpu_step(cpu[b], b);
      const std::vector<float>& oc = ref.o;
      const std::vector<int32_t>& sc = ref.sel;
      bool same = true;
      for (int64_t g = 0; g < G; ++g) {
        ++sel_sets;
        const bool same_g = std::equal(sc.begin() + g * c.n_sel, sc.begin() + (g + 1) * c.n_sel,
                                       sel_gpu.begin() + (b * G + g) * c.n_sel);
        sel_diff += same_g ? 0 : 1;
        same = same && same_g;
      }
      float mx = 0, err = 0;
      for (size_t i = 0; i < oc.size(); ++i) {
        mx = std::max(mx, std::fabs(oc[i]));
        err = std::max(err, std::fabs(oc[i] - og[b * H * c.dv + i]));
      }
      const float tol = mx / 128.0f + 1e-3f;
      if (!same) continue;  // a near tie chose another block: o differs legitimately
      worst = std::max(worst, static_cast<double>(err / tol));
      ASSERT_LE(err, tol) << "step " << e << " sequence " << b << " at " << lengths[b] + e;
    }
  }
  std::printf(
      "[ long ] %lld steps × %lld sequences of up to %lld tokens, caches for %lld: worst |Δo| / "
      "tol %.3f; selection sets that differ %lld of %lld\n",
      static_cast<long long>(steps), static_cast<long long>(B), static_cast<long long>(longest),
      static_cast<long long>(capacity), worst, static_cast<long long>(sel_diff),
      static_cast<long long>(sel_sets));
  EXPECT_LE(sel_diff * 200, std::max<int64_t>(sel_sets, 200))
      << "more than 0.5 % (and more than one) of the selections differ";
}

// The top-n's chunking of a decoder of `sequences` × m7c's 2 groups and 6 heads a group for
// `capacity` tokens on this GPU (decode_chunks.h; the CPU test DecodeChunks states the rule),
// checked to be `on_132` on a GPU of 132 SMs (H100 SXM, H200), the case the test was written for.
cuda::decode::TopkChunks m7c_chunking(int64_t capacity, int64_t sequences,
                                      cuda::decode::TopkChunks on_132) {
  const int sms = cuda::current_sm_count();
  const cuda::decode::TopkChunks c =
      cuda::decode::decoder_topk_chunks(capacity, 64, sequences * 2, 6, sms);
  if (sms == 132) {
    EXPECT_EQ(c.chunk, on_132.chunk);
    EXPECT_EQ(c.chunks, on_132.chunks);
  }
  return c;
}

// Long contexts, where every branch is split into many parts: 50,001 and 12,345 tokens – no
// multiple of d, l, l_sel, w or the 128-key parts – then 70 steps that cross compressed emissions
// and a block boundary. At 50,001 tokens a step has 3,124 compressed tokens (25 compressed parts,
// pre-merged per head), 779 candidate blocks (13 block top-n chunks whose candidate lists are
// merged), 4 window parts and 13 picked blocks in 7 parts, the rows at (b·G + g)·rows offsets.
TEST(CudaDecodeLong, PrefilledLongContextsMatchTheCpuCache) {
  expect_prefilled_matches_cpu({50001, 12345}, 50001 + 70, 70, {64, 13});
}

// Caches for 530,000 tokens, filled to 20,001 and 3,333: the top-n's chunks hold 320 blocks – more
// than its 256 threads, so the block sums' loop scores a second round and the chunk's 42 warps'
// weights take a second pass – and the TMA maps span 4 × 530,000 rows of the selected caches.
// (Below 32 SMs its 4 × (26 + 6) top-n CTAs would not fit in a wave: chunks of 640,
// decode_chunks.h.)
TEST(CudaDecodeLong, LargeCapacityChunksMatchTheCpuCache) {
  expect_prefilled_matches_cpu({20001, 3333}, 530000, 20, m7c_chunking(530000, 2, {320, 26}));
}

// Eight sequences with caches for 131,072 tokens: 32 chunks of 64 candidate blocks a (sequence,
// group) would make a top-n grid of 16 × (32 + 6) = 608 CTAs, more than a wave of four an SM on
// 132 SMs, so there the decoder takes 16 chunks of 128 (decode_chunks.h), whose ranking takes two
// rounds of a CTA's threads.
TEST(CudaDecodeLong, WidenedChunksMatchTheCpuCache) {
  expect_prefilled_matches_cpu({20001, 3333, 9001, 131, 14000, 20001, 64, 7777}, 131072, 20,
                               m7c_chunking(131072, 8, {128, 16}));
}

// Sixteen sequences with caches for 65,536 tokens – the benchmark's 64k, B = 16 shape: a top-n
// grid of 32 × (16 + 6) = 704 CTAs, a wave and a third on 132 SMs (16 chunks of 64: no more than
// half the lists a selection merges, so they stay), the picks' 32 × 8 CTAs and the parts' 32 × 37
// several an SM, every one's rows by TMA.
TEST(CudaDecodeLong, SixteenSequencesMatchTheCpuCache) {
  expect_prefilled_matches_cpu({20001, 3333, 9001, 131, 14000, 8193, 64, 7777, 16385, 1, 12288,
                                5000, 19999, 640, 8191, 2049},
                               65536, 20, m7c_chunking(65536, 16, {64, 16}));
}

// Twelve sequences with caches for 65,536 tokens: the picks' 24 × 8 = 192 CTAs are more than the
// SMs of an H100 or H200 and at most 1.5 times them, so the decoder asks for two picks CTAs an SM
// at most where every cluster still fits (a launch with more shared memory a CTA; the kernels are
// the same).
TEST(CudaDecodeLong, TwelveSequencesMatchTheCpuCache) {
  expect_prefilled_matches_cpu(
      {20001, 3333, 9001, 131, 14000, 8193, 64, 7777, 16385, 1, 12288, 5000}, 65536, 20,
      m7c_chunking(65536, 12, {64, 16}));
}

ModelConfig tiny_model(const std::map<std::string, std::string>& overrides) {
  ModelConfig cfg = load_model_config(std::string(NSA_SOURCE_DIR) + "/configs/tiny.yaml");
  for (const auto& [k, v] : overrides) set_model_field(cfg, k, v);
  cfg.validate();
  return cfg;
}

// The whole decoder: logits within 3 % of max |logit| of the CPU decoder (bf16 weights and
// activations) and selected blocks as the CPU chose, for B sequences decoded together.
void expect_decoder_matches_cpu(const std::map<std::string, std::string>& overrides, int64_t B) {
  const ModelConfig cfg = tiny_model(overrides);
  ModelParams<float> params = init_model_params<float>(cfg);
  for (auto& layer : params.layers) {  // sharper attention: selections are decided, not tied
    for (float& x : layer.wq.data) x *= 6.0f;
    for (auto& wk : layer.wk)
      for (float& x : wk.data) x *= 6.0f;
  }
  const int64_t steps = 200, V = cfg.vocab_size, G = cfg.attn.groups;
  cuda::ModelDecoderCuda gpu(cfg, params, B, steps, false);
  std::vector<ModelDecoder> cpu;
  for (int64_t b = 0; b < B; ++b) cpu.emplace_back(cfg, params, steps);
  std::mt19937 rng(5);
  std::uniform_int_distribution<int32_t> tok(0, static_cast<int32_t>(V - 1));
  int64_t sets = 0, differ = 0;
  double worst = 0;
  for (int64_t t = 0; t < steps; ++t) {
    std::vector<int32_t> tokens(static_cast<size_t>(B));
    for (auto& x : tokens) x = tok(rng);
    const std::vector<float> lg = gpu.step(tokens);
    for (int64_t b = 0; b < B; ++b) {
      const std::vector<float> lc = cpu[b].step(tokens[b]);
      float mx = 0, err = 0;
      for (int64_t i = 0; i < V; ++i) {
        mx = std::max(mx, std::fabs(lc[i]));
        err = std::max(err, std::fabs(lc[i] - lg[b * V + i]));
      }
      worst = std::max(worst, static_cast<double>(err / (0.03f * mx + 1e-3f)));
      ASSERT_LE(err, 0.03f * mx + 1e-3f) << "step " << t << " sequence " << b;
    }
    for (int64_t li = 0; li < cfg.n_layers; ++li) {
      const std::vector<int32_t> sg = gpu.selection(li);
      for (int64_t b = 0; b < B; ++b) {
        const std::vector<int32_t>& sc = cpu[b].last_selection()[li];
        for (int64_t g = 0; g < G; ++g) {
          ++sets;
          bool same = true;
          for (int64_t j = 0; j < cfg.attn.n_sel; ++j)
            same = same && sc[g * cfg.attn.n_sel + j] == sg[(b * G + g) * cfg.attn.n_sel + j];
          differ += same ? 0 : 1;
        }
      }
    }
  }
  std::printf(
      "[ decoder ] %lld steps × %lld sequences: worst |Δlogit| / tol %.3f; selection sets "
      "that differ %lld of %lld\n",
      static_cast<long long>(steps), static_cast<long long>(B), worst,
      static_cast<long long>(differ), static_cast<long long>(sets));
  EXPECT_LE(differ * 20, sets) << "more than 5 % of the selections differ";
  EXPECT_EQ(gpu.position(), steps);
  EXPECT_THROW(gpu.step(std::vector<int32_t>(static_cast<size_t>(B), 0)), Error);  // caches full
  cuda::ModelDecoderCuda small(cfg, params, 2, 8, false);
  EXPECT_THROW(small.step({0, static_cast<int32_t>(V)}), Error);  // out of the vocabulary
  EXPECT_THROW(small.step({0}), Error);                           // wrong batch
}

class CudaDecoder : public ::testing::TestWithParam<std::map<std::string, std::string>> {};

// One sequence: the linear layers run on the few-row kernels (gemv.h) and the projection with
// the step's inputs fused in; three sequences: the skinny kernels (skinny_gemm.h).
TEST_P(CudaDecoder, LogitsAndSelectionsMatchTheCpuDecoder) {
  static_assert(1 <= cuda::kGemvFasterRows && 3 > cuda::kGemvFasterRows,
                "one row must take the few-row kernels, three the skinny ones");
  expect_decoder_matches_cpu(GetParam(), 1);
  expect_decoder_matches_cpu(GetParam(), 3);
}

// Five sequences: the linear layers run on the tensor-core skinny kernels instead (more rows than
// the few-row kernels take; skinny_gemm.h), the RMSNorm and the MLP's activation folded in.
TEST(CudaDecoderSkinny, LogitsAndSelectionsMatchTheCpuDecoder) {
  static_assert(5 > cuda::kGemvMaxRows && 5 <= cuda::kSkinnyMaxRows,
                "five rows must take the skinny kernel");
  expect_decoder_matches_cpu({}, 5);
  expect_decoder_matches_cpu({{"mlp", "silu"}, {"kv", "shared"}}, 5);
}

// Seventeen sequences: more rows than the skinny kernel takes, so cuBLASLt's GEMMs.
TEST(CudaDecoderGemms, LogitsAndSelectionsMatchTheCpuDecoder) {
  static_assert(17 > cuda::kSkinnyMaxRows, "seventeen rows must take the GEMMs");
  expect_decoder_matches_cpu({}, 17);
}

// The GPU decoder compresses by averaging only: φ = mlp (which trains on the GPU) is refused
// before anything is allocated, with the way out named.
TEST(CudaDecoderErrors, PhiMlpIsRefusedByName) {
  const ModelConfig cfg = tiny_model({{"phi", "mlp"}});
  const ModelParams<float> params = init_model_params<float>(cfg);
  try {
    cuda::ModelDecoderCuda gpu(cfg, params, 1, 8, false);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("phi = avg only"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("--device cpu"), std::string::npos) << e.what();
  }
}

INSTANTIATE_TEST_SUITE_P(
    Variants, CudaDecoder,
    ::testing::Values(std::map<std::string, std::string>{},
                      std::map<std::string, std::string>{{"kv", "shared"}, {"gate", "softmax"}},
                      std::map<std::string, std::string>{{"branches", "sel,win"}, {"mlp", "silu"}},
                      std::map<std::string, std::string>{{"attention", "full"}},
                      std::map<std::string, std::string>{{"attention", "window"}, {"w", "32"}}));

}  // namespace
}  // namespace nsa::test
