// Hostile inputs to the readers and the attention file contract: sizes that overflow, folders
// where files belong, non-finite tensors, sizes too big for memory – each an nsa::Error naming
// the file, tensor or field, never a crash, a wrong file or silent NaN.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>

#include "../common/test_util.h"
#include "io/attention_file.h"
#include "io/safetensors.h"
#include "io/token_shard.h"
#include "nsa/model_config.h"
#include "nsa/presets.h"
#include "nsa/size_limits.h"

namespace nsa::test {
namespace {
namespace fs = std::filesystem;

void write_raw(const std::string& path, const std::string& header, const std::string& data) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((header.size() >> (8 * i)) & 0xff);
  std::ofstream(path, std::ios::binary) << out + header + data;
}

TEST(HostileInputs, ShapeWhoseSizeOverflowsIsRefused) {
  const std::string path = unique_temp_path("overflow.safetensors");
  // 2^32 · 2^32 · 4 bytes wraps to 0 in 64 bits: the 0-byte span must not pass for it.
  write_raw(path, R"({"x":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,0]}})",
            "");
  const std::string err = error_of([&] { io::SafetensorsFile::read(path); });
  EXPECT_NE(err.find("overflows a 64-bit byte count"), std::string::npos) << err;
  EXPECT_NE(err.find(path), std::string::npos) << err;
}

TEST(HostileInputs, FoldersWhereFilesBelong) {
  const fs::path dir = unique_temp_path("a_folder");
  fs::create_directories(dir);
  std::string err = error_of([&] { io::SafetensorsFile::read(dir.string()); });
  EXPECT_NE(err.find("is a folder"), std::string::npos) << err;
  err = error_of([&] { io::read_token_shard(dir.string()); });
  EXPECT_NE(err.find("is a folder"), std::string::npos) << err;
  io::SafetensorsFile f;
  f.put("x", Tensor<float>({2}));
  err = error_of([&] { f.write(dir.string()); });
  EXPECT_NE(err.find("is a folder"), std::string::npos) << err;
  EXPECT_FALSE(fs::exists(dir.string() + ".tmp")) << "no temporary left behind";
}

TEST(HostileInputs, NonFiniteAttentionInputsAreNamed) {
  const NsaConfig cfg = attention_preset("tiny");
  for (const char* name : {"q", "k_sel", "g_win", "do"}) {
    io::SafetensorsFile f = io::make_example_problem(cfg, 1, 40, 1);
    Tensor<float> t = f.get_float(name);
    t[t.numel() / 2] = std::string(name) == "g_win" ? INFINITY : NAN;
    f.put(name, t);
    const std::string path = unique_temp_path("nan.safetensors");
    f.write(path);
    const io::SafetensorsFile back = io::SafetensorsFile::read(path);
    const std::string err = error_of([&] { io::load_attention_problem(back, {}); });
    EXPECT_NE(err.find(str("tensor '", name, "'")), std::string::npos) << err;
    EXPECT_NE(err.find("must be finite"), std::string::npos) << err;
  }
}

TEST(HostileInputs, SizesAreBoundedBeforeAllocating) {
  const NsaConfig cfg = attention_preset("tiny");
  std::string err = error_of([&] { io::make_example_problem(cfg, 1, int64_t{1} << 62, 0); });
  EXPECT_NE(err.find("--seq-len"), std::string::npos) << err;
  err = error_of([&] { io::make_example_problem(cfg, 1 << 20, 1 << 20, 0); });
  EXPECT_NE(err.find("needs"), std::string::npos) << err;
  EXPECT_NE(err.find("GiB, limit"), std::string::npos) << err;
  EXPECT_NE(error_of([&] { io::make_example_problem(cfg, 1, -7, 0); }).find("--seq-len = -7"),
            std::string::npos);
  NsaConfig big = cfg;
  big.w = 10000000000;
  EXPECT_NE(error_of([&] { big.validate(); }).find("w = 10000000000 must be at most"),
            std::string::npos);
  ModelConfig m = load_model_config(std::string(NSA_SOURCE_DIR) + "/configs/tiny.yaml");
  m.vocab_size = int64_t{1} << 62;
  EXPECT_NE(error_of([&] { m.validate(); }).find("vocab_size"), std::string::npos);
  m.vocab_size = 256;
  m.n_layers = 100000000;
  EXPECT_NE(error_of([&] { m.validate(); }).find("n_layers"), std::string::npos);
  m.n_layers = 4097;
  EXPECT_NE(error_of([&] { m.validate(); }).find("n_layers = 4097 must be at most 4096"),
            std::string::npos);
  m.n_layers = 4096, m.dim = 1 << 16;  // legal, but terabytes of weights
  err = error_of([&] { m.validate(); });
  EXPECT_NE(err.find("the model's fp32 weights"), std::string::npos) << err;
  EXPECT_NE(err.find("GiB, limit"), std::string::npos) << err;
  EXPECT_NE(error_of([] {
              checked_product({int64_t{1} << 40, int64_t{1} << 40}, "x");
            }).find("x overflows 64 bits"),
            std::string::npos);
}

// A config named instead of given as a file (`--config tiny`), a directory, an unknown field: each
// error says what is allowed, not the YAML parser's "bad file" or the attention's fields alone.
TEST(HostileInputs, ConfigErrorsSayWhatIsAllowed) {
  std::string err = error_of([] { load_model_config("tiny"); });
  EXPECT_NE(err.find("config 'tiny' does not exist: a model config is a YAML file, e.g. "
                     "configs/tiny.yaml"),
            std::string::npos)
      << err;
  err = error_of([] { load_model_config(NSA_SOURCE_DIR); });
  EXPECT_NE(err.find("is a directory, not a YAML file"), std::string::npos) << err;
  // An unknown field (a YAML key or `--set`) lists the model's fields and the attention's.
  ModelConfig m;
  err = error_of([&] { set_model_field(m, "nosuch", "3"); });
  EXPECT_NE(err.find("unknown config field 'nosuch'; known: "), std::string::npos) << err;
  EXPECT_NE(err.find("n_layers"), std::string::npos) << err;
  EXPECT_NE(err.find("n_sel"), std::string::npos) << err;
  set_model_field(m, "n_sel", "9");  // an attention field still reaches the attention config
  EXPECT_EQ(m.attn.n_sel, 9);
}

}  // namespace
}  // namespace nsa::test
