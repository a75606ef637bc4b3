// A checkpoint is input like any other: every field of state.json is checked (type, range, the
// model config, the step against the folder and the data), non-finite weights are refused by
// name, and a run checks its options and both data splits before its first step.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>

#include "../common/test_util.h"
#include "io/safetensors.h"
#include "io/token_shard.h"
#include "nsa/error.h"
#include "resume_check.h"
#include "train/checkpoint.h"
#include "train/trainer.h"

namespace nsa::test {
namespace {
namespace fs = std::filesystem;

TrainOptions one_step(const fs::path& out) {
  return tiny_train_options(out, 1);
}
// A one-step run's checkpoint with state.json edited by `edit`; returns the resume's error.
std::string resume_after_edit(const std::function<void(nlohmann::json&)>& edit) {
  const fs::path run = fs::temp_directory_path() / "nsa_test_state_json";
  TrainOptions o = one_step(run);
  train(o);
  const fs::path state = run / "ckpt_00000001" / "state.json";
  nlohmann::json j = nlohmann::json::parse(read_file_bytes(state));
  edit(j);
  std::ofstream(state) << j.dump();
  o.resume = true;
  o.steps = 2;
  return error_of([&] { train(o); });
}

TEST(CheckpointState, EveryFieldIsValidatedAndNamed) {
  const struct {
    std::function<void(nlohmann::json&)> edit;
    const char* expected;
  } cases[] = {
      {[](nlohmann::json& j) { j["train_position"] = -1; }, "'train_position' = -1 must be in"},
      {[](nlohmann::json& j) { j["step"] = -3; }, "'step' = -3 must be in [1, "},
      {[](nlohmann::json& j) { j["step"] = uint64_t{1} << 63; }, "'step' = 9223372036854775808"},
      {[](nlohmann::json& j) { j["step"] = 1.5; }, "'step' = 1.5 must be an integer"},
      {[](nlohmann::json& j) { j["step"] = 7; }, "step 7 does not match its folder"},
      {[](nlohmann::json& j) { j.erase("train_position"); }, "'train_position' is missing"},
      {[](nlohmann::json& j) { j["extra"] = 1; }, "unknown field 'extra'"},
      {[](nlohmann::json& j) { j["model_config"]["vocab_size"] = "4611686018427387904"; },
       "vocab_size = 4611686018427387904 must be at most"},
      {[](nlohmann::json& j) { j["model_config"]["n_layers"] = "100000000"; }, "n_layers"},
      {[](nlohmann::json& j) { j["model_config"]["bogus"] = "1"; }, "bogus"},
      {[](nlohmann::json& j) { j["model_config"]["dim"] = 32; }, "'dim' = 32 must be a string"},
      {[](nlohmann::json& j) { j["train_position"] = int64_t{1} << 50; }, "beyond the training"},
  };
  for (const auto& c : cases) {
    const std::string err = resume_after_edit(c.edit);
    EXPECT_NE(err.find(c.expected), std::string::npos) << err;
    EXPECT_NE(err.find("ckpt_00000001"), std::string::npos) << "names the checkpoint: " << err;
  }
}

TEST(CheckpointState, MissingAndNonFiniteCheckpointsAreNamed) {
  const fs::path run = fs::temp_directory_path() / "nsa_test_nan_weights";
  train(one_step(run));
  const fs::path ckpt = run / "ckpt_00000001";
  EXPECT_NE(
      error_of([&] { load_model_checkpoint((run / "nope").string()); }).find("does not exist"),
      std::string::npos);
  io::SafetensorsFile f = io::SafetensorsFile::read((ckpt / "model.safetensors").string());
  const std::string name = f.names().front();
  Tensor<float> t = f.get_float(name);
  t[3] = NAN;
  f.put(name, t);
  f.write((ckpt / "model.safetensors").string());
  const std::string err = error_of([&] { load_model_checkpoint(ckpt.string()); });
  EXPECT_NE(err.find(str("tensor '", name, "'")), std::string::npos) << err;
  EXPECT_NE(err.find("at index 3"), std::string::npos) << err;
}

TEST(TrainStartup, OptionsOutOfRangeAreRefusedByFlag) {
  const fs::path run = fs::temp_directory_path() / "nsa_test_option_ranges";
  const struct {
    std::function<void(TrainOptions&)> edit;
    const char* expected;
  } cases[] = {
      {[](TrainOptions& o) { o.seq_len = -7; }, "--seq-len = -7 must be in [0, "},
      {[](TrainOptions& o) { o.val_every = 1, o.val_batches = 0; }, "--val-batches = 0"},
      {[](TrainOptions& o) { o.val_batches = -3; }, "--val-batches = -3"},
      {[](TrainOptions& o) { o.adam.lr = -1; }, "--lr = -1 must be a finite number >= 0"},
      {[](TrainOptions& o) { o.adam.lr = NAN; }, "--lr = nan"},
      {[](TrainOptions& o) { o.keep = -1; }, "--keep = -1"},
      {[](TrainOptions& o) { o.overrides["branches"] = ""; }, "branches is empty"},
      {[](TrainOptions& o) { o.seq_len = int64_t{1} << 40; }, "--seq-len = 1099511627776"},
      {[](TrainOptions& o) { o.batch = 1 << 20, o.seq_len = 1 << 20; }, "GiB, limit"},
  };
  for (const auto& c : cases) {
    TrainOptions o = one_step(run);
    c.edit(o);
    const std::string err = error_of([&] { train(o); });
    EXPECT_NE(err.find(c.expected), std::string::npos) << err;
    EXPECT_FALSE(fs::exists(run / "metrics.jsonl")) << "refused before the first step";
  }
}

TEST(TrainStartup, ValidationDataIsCheckedBeforeTheFirstStep) {
  const fs::path data = fs::temp_directory_path() / "nsa_test_val_startup";
  fs::remove_all(data);
  fs::create_directories(data);
  io::write_token_shard((data / "train_000000.bin").string(), std::vector<uint32_t>(2000, 7));
  TrainOptions o = one_step(data / "run");
  o.data = data.string();
  o.val_every = 100;  // the first validation would come at the last step
  EXPECT_NE(error_of([&] { train(o); }).find("has no val_*.bin shards"), std::string::npos);
  EXPECT_FALSE(fs::exists(data / "run" / "metrics.jsonl"));
  io::write_token_shard((data / "val_000000.bin").string(), std::vector<uint32_t>(500, 70));
  EXPECT_NE(error_of([&] { train(o); }).find("token 70 at index 0"), std::string::npos);
  io::write_token_shard((data / "val_000000.bin").string(), std::vector<uint32_t>(50, 7));
  EXPECT_NE(error_of([&] { train(o); }).find("the val split has 50 tokens"), std::string::npos);
  std::ofstream(data / "val_000000.bin") << "damaged";
  EXPECT_NE(error_of([&] { train(o); }).find("val_000000.bin"), std::string::npos);
  EXPECT_FALSE(fs::exists(data / "run" / "metrics.jsonl"));
}

}  // namespace
}  // namespace nsa::test
