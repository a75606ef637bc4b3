// The `nsa attention` file contract: loading validates names, shapes, dtypes and metadata with
// one clear message each; a saved result holds what the direct call computes; BF16 inputs and
// packed documents (cu_seqlens) are accepted.
#include <gtest/gtest.h>

#include <cstring>

#include <filesystem>

#include "../common/test_util.h"
#include "io/attention_file.h"

namespace nsa::test {
namespace {

std::string temp_path(const std::string& name) {
  return unique_temp_path(name);
}

NsaConfig example_config(Phi phi = Phi::kAvg, KvMode kv = KvMode::kSeparate) {
  return make_config({4, 2, 8, 6}, {8, 4, 16, 4, 12}, phi, kv);
}

// Writes `f`, reads it back, loads it as a problem: the path through a real file.
io::AttentionProblem reload(const io::SafetensorsFile& f,
                            const std::map<std::string, std::string>& overrides = {}) {
  const std::string path = temp_path("attn.safetensors");
  f.write(path);
  return io::load_attention_problem(io::SafetensorsFile::read(path), overrides);
}

void expect_load_error(const io::SafetensorsFile& f, const std::string& fragment,
                       const std::map<std::string, std::string>& overrides = {}) {
  try {
    reload(f, overrides);
    FAIL() << "accepted; expected '" << fragment << "'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
  }
}

TEST(AttentionFile, ExampleRoundTripsAndMatchesDirectCall) {
  for (Phi phi : {Phi::kAvg, Phi::kMlp}) {
    for (KvMode kv : {KvMode::kSeparate, KvMode::kShared}) {
      const NsaConfig cfg = example_config(phi, kv);
      const io::AttentionProblem p = reload(io::make_example_problem(cfg, 2, 45, 3));
      EXPECT_EQ(p.cfg.summary(), cfg.summary());
      ASSERT_TRUE(p.has_do);
      const auto fwd = nsa_forward_cpu(p.cfg, p.layout, p.in);
      const auto grads = nsa_backward_cpu(p.cfg, p.layout, p.in, fwd, p.d_o);
      const std::string out = temp_path("attn_out.safetensors");
      io::save_attention_result(out, p, fwd, &grads);
      const auto r = io::SafetensorsFile::read(out);
      Tensor<float> o = r.get_float("o");
      EXPECT_EQ(o.shape, (Shape{2, 45, 4, 6}));
      EXPECT_EQ(o.data, fwd.o.data);
      EXPECT_EQ(r.at("sel_idx").shape, (Shape{2, 45, 2, 4}));
      EXPECT_EQ(r.get_float("dq").data, grads.q.data);
      EXPECT_TRUE(r.has(kv == KvMode::kShared ? "dk" : "dk_sel"));
      EXPECT_EQ(r.has("dphi_k_w1"), phi == Phi::kMlp);
      EXPECT_TRUE(r.has("dg_win") && r.has("lse_cmp") && r.has("o_sel"));
    }
  }
}

TEST(AttentionFile, OverridesReplaceMetadata) {
  const io::AttentionProblem p =
      reload(io::make_example_problem(example_config(), 1, 30, 3), {{"n_sel", "6"}, {"w", "5"}});
  EXPECT_EQ(p.cfg.n_sel, 6);
  EXPECT_EQ(p.cfg.w, 5);
}

TEST(AttentionFile, AcceptsBf16AndPackedDocuments) {
  io::SafetensorsFile f = io::make_example_problem(example_config(), 1, 40, 4);
  // Re-store q as BF16 (truncating the mantissa): still accepted, values as stored.
  const Tensor<float> q = f.get_float("q");
  io::StoredTensor bf{io::DType::kBF16, q.shape, std::vector<uint8_t>(q.data.size() * 2)};
  for (size_t i = 0; i < q.data.size(); ++i) {
    uint32_t bits;
    std::memcpy(&bits, &q.data[i], 4);
    bf.bytes[2 * i] = static_cast<uint8_t>(bits >> 16);
    bf.bytes[2 * i + 1] = static_cast<uint8_t>(bits >> 24);
  }
  io::SafetensorsFile g;
  for (const auto& name : f.names()) {
    if (name != "q") g.put(name, f.get_float(name));
  }
  g.metadata = f.metadata;
  g.put("q", bf);
  Tensor<int32_t> cu({3});
  cu[0] = 0, cu[1] = 17, cu[2] = 40;
  g.put("cu_seqlens", cu);
  const io::AttentionProblem p = reload(g);
  for (int64_t i = 0; i < q.numel(); ++i) {
    EXPECT_LE(std::fabs(p.in.q[i] - q[i]), std::fabs(q[i]) / 128) << "bf16 q[" << i << "]";
  }
  EXPECT_EQ(p.layout.num_seqs(), 2);
  EXPECT_EQ(p.layout.length(1), 23);
}

TEST(AttentionFile, RejectsBadInputsByName) {
  const NsaConfig cfg = example_config();
  const io::SafetensorsFile good = io::make_example_problem(cfg, 2, 30, 5);
  auto without = [&](const std::string& drop) {
    io::SafetensorsFile f;
    for (const auto& name : good.names()) {
      if (name != drop) f.put(name, good.get_float(name));
    }
    f.metadata = good.metadata;
    return f;
  };
  expect_load_error(without("k_sel"), "has no tensor 'k_sel'");
  expect_load_error(without("g_win"), "has no tensor 'g_win'");
  io::SafetensorsFile f = without("");
  f.put("v_win", Tensor<float>({2, 30, 2, 5}));
  expect_load_error(f, "tensor 'v_win' has shape [60,2,5], expected [60,2,6]");
  f = without("");
  f.put("g_sel", Tensor<float>({2, 31, 4}));
  expect_load_error(f, "tensor 'g_sel' has shape [2,31,4]");
  f = without("");
  f.put("q_extra", Tensor<float>({1}));
  expect_load_error(f, "unexpected tensor 'q_extra'");
  f = without("");
  f.put("k_win", Tensor<int32_t>({2, 30, 2, 8}));
  expect_load_error(f, "tensor 'k_win'");
  f = without("");
  f.metadata.erase("l_sel");
  expect_load_error(f, "hyper-parameter 'l_sel' is missing");
  expect_load_error(without(""), "l = 10 must be a multiple of d = 4", {{"l", "10"}});
  f = without("");
  Tensor<int32_t> cu({2});
  cu[1] = 60;
  f.put("cu_seqlens", cu);
  expect_load_error(f, "batch dim must be 1");
}

}  // namespace
}  // namespace nsa::test
