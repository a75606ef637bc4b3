// Bad hyper-parameters are rejected with a message that names the field and the rule.
#include <gtest/gtest.h>

#include "../common/test_util.h"
#include "nsa/presets.h"

namespace nsa::test {
namespace {

void expect_rejected(NsaConfig cfg, const std::string& fragment) {
  try {
    cfg.validate();
    FAIL() << "config accepted, expected an error containing '" << fragment << "'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos)
        << "message '" << e.what() << "' lacks '" << fragment << "'";
  }
}

NsaConfig good() {
  return make_config({4, 2, 16, 16}, {16, 8, 32, 4, 64});
}

TEST(Config, PresetsAreValid) {
  for (const std::string& name : attention_preset_names())
    EXPECT_NO_THROW(attention_preset(name).validate());
  EXPECT_THROW(attention_preset("huge"), Error);
}

TEST(Config, RejectsBrokenRules) {
  NsaConfig c = good();
  c.l = 12;  // d = 8 does not divide 12
  expect_rejected(c, "l = 12 must be a multiple of d = 8");
  c = good();
  c.l_sel = 20;
  expect_rejected(c, "l_sel = 20 must be a multiple of d = 8");
  c = good();
  c.heads = 6;
  c.groups = 4;
  expect_rejected(c, "heads = 6 must be a multiple of groups = 4");
  c = good();
  c.n_sel = 2;
  expect_rejected(c, "n_sel = 2 must be at least 3");
  c = good();
  c.scale = -1;
  expect_rejected(c, "scale");
  for (const char* field : {"heads", "groups", "dk", "dv", "l", "d", "l_sel", "n_sel", "w"}) {
    c = good();
    set_config_field(c, field, "0");
    expect_rejected(c, std::string(field) + " = 0 must be a positive integer");
  }
}

TEST(Config, FieldParserNamesTheField) {
  NsaConfig c = good();
  set_config_field(c, "n_sel", "16");
  EXPECT_EQ(c.n_sel, 16);
  set_config_field(c, "phi", "mlp");
  EXPECT_EQ(c.phi, Phi::kMlp);
  EXPECT_THROW(set_config_field(c, "n_sel", "many"), Error);
  EXPECT_THROW(set_config_field(c, "phi", "max"), Error);
  EXPECT_THROW(set_config_field(c, "kv", "both"), Error);
  EXPECT_THROW(set_config_field(c, "window", "3"), Error);
  try {
    set_config_field(c, "l_sel", "3x");
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("l_sel = '3x' is not an integer"), std::string::npos);
  }
}

TEST(Config, CountsCompressedTokens) {
  const NsaConfig c = good();  // l = 16, d = 8
  EXPECT_EQ(c.num_compressed(15), 0);
  EXPECT_EQ(c.num_compressed(16), 1);
  EXPECT_EQ(c.num_compressed(23), 1);
  EXPECT_EQ(c.num_compressed(24), 2);
  EXPECT_EQ(c.num_visible_compressed(14), 0);
  EXPECT_EQ(c.num_visible_compressed(15), 1);
}

TEST(Config, RejectsBadLayouts) {
  EXPECT_THROW(SeqLayout::packed({0, 5, 3, 10}, 10), Error);
  EXPECT_THROW(SeqLayout::packed({1, 10}, 10), Error);
  EXPECT_THROW(SeqLayout::packed({0, 9}, 10), Error);
  EXPECT_THROW(SeqLayout::batch(0, 10), Error);
}

TEST(Config, WrongTensorShapeNamesTheTensor) {
  const NsaConfig cfg = good();
  NsaTensors<float> in = random_nsa_inputs<float>(cfg, 40, 1);
  in.v[kWin] = Tensor<float>({40, 2, 8});
  try {
    nsa_forward_cpu(cfg, SeqLayout::batch(1, 40), in);
    FAIL() << "wrong shape accepted";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), "tensor 'v_win' has shape [40,2,8], expected [40,2,16]");
  }
}

}  // namespace
}  // namespace nsa::test
