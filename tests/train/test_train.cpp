// Training: AdamW and its schedule, exact resume (N steps + resume N = 2N steps, bit for bit),
// --init-from (a fresh run from a checkpoint's weights), clear errors for damaged checkpoints,
// mismatched configs and out-of-vocabulary data.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>

#include "io/token_shard.h"
#include "nsa/error.h"
#include "resume_check.h"
#include "train/adamw.h"
#include "train/checkpoint.h"
#include "train/trainer.h"

namespace nsa::test {
namespace {
namespace fs = std::filesystem;

TrainOptions small_run(const std::string& out) {
  TrainOptions o;
  o.config = std::string(NSA_SOURCE_DIR) + "/configs/tiny.yaml";
  o.overrides = {{"dim", "32"}, {"n_layers", "1"}, {"seq_len", "48"}, {"vocab_size", "64"}};
  o.out_dir = out;
  o.steps = 6;
  o.batch = 2;
  o.adam.warmup = 2;
  o.val_every = 3;
  o.val_batches = 1;
  o.ckpt_every = 0;
  o.quiet = true;
  fs::remove_all(out);
  return o;
}

TEST(AdamW, OneStepMatchesTheFormula) {
  AdamWConfig c;
  c.lr = 0.1, c.warmup = 0, c.total_steps = 10, c.weight_decay = 0.5, c.clip = 0;
  Tensor<float> p({2}), g({2});
  p[0] = 1.0f, p[1] = -2.0f, g[0] = 0.5f, g[1] = -0.25f;
  AdamW opt(c, {&p}, {true});
  opt.step(0, {&g});
  // t = 1: m̂ = g, v̂ = g², update = g/|g| + wd·p.
  EXPECT_NEAR(p[0], 1.0 - 0.1 * (1.0 + 0.5 * 1.0), 1e-6);
  EXPECT_NEAR(p[1], -2.0 - 0.1 * (-1.0 + 0.5 * -2.0), 1e-6);
  EXPECT_NEAR(lr_at(c, 0), 0.1, 1e-12);
  c.warmup = 4;
  EXPECT_NEAR(lr_at(c, 0), 0.025, 1e-12);
  EXPECT_NEAR(lr_at(c, 3), 0.1, 1e-12);
  EXPECT_NEAR(lr_at(c, 10), c.min_lr, 1e-12);
}

TEST(AdamW, ClipsTheGlobalNorm) {
  AdamWConfig c;
  c.clip = 1.0, c.warmup = 0;
  Tensor<float> p({2}), g({2});
  g[0] = 3.0f, g[1] = 4.0f;
  AdamW opt(c, {&p}, {false});
  EXPECT_NEAR(opt.step(0, {&g}), 5.0, 1e-6);  // the pre-clip norm is reported
  // Clipped to norm 1: m = 0.1·(0.6, 0.8) after one step (β1 = 0.9).
  EXPECT_NEAR(opt.m()[0][0], 0.06f, 1e-6);
  EXPECT_NEAR(opt.m()[0][1], 0.08f, 1e-6);
}

// ZeRO-1's arithmetic without MPI: two optimizers owning [0, k) and [k, N) of the same
// parameters, each updating its own slice, reproduce the unsharded update bit for bit; the
// materialised moments equal the unsharded ones where owned and are zero elsewhere.
TEST(AdamW, ShardsReproduceTheUnshardedUpdate) {
  AdamWConfig c;
  c.warmup = 1, c.weight_decay = 0.1;
  Tensor<float> a({3, 4}), b({5});  // a matrix (decayed) and a vector
  for (int64_t i = 0; i < a.numel(); ++i) a[i] = 0.1f * static_cast<float>(i) - 0.4f;
  for (int64_t i = 0; i < b.numel(); ++i) b[i] = 0.3f - 0.05f * static_cast<float>(i);
  Tensor<float> ga = a, gb = b;
  for (float& x : ga.data) x = x * 0.7f + 0.01f;
  for (float& x : gb.data) x = -x * 1.3f;
  Tensor<float> a0 = a, b0 = b, a1 = a, b1 = b, a2 = a, b2 = b;
  AdamW full(c, {&a0, &b0}, {true, false}), lo(c, {&a1, &b1}, {true, false}),
      hi(c, {&a2, &b2}, {true, false});
  const int64_t k = 7, n = a.numel() + b.numel();
  lo.shard(0, k);
  hi.shard(k, n);
  for (int64_t step = 0; step < 3; ++step) {
    EXPECT_EQ(full.step(step, {&ga, &gb}), lo.step(step, {&ga, &gb}));
    hi.step(step, {&ga, &gb});
  }
  for (int64_t i = 0; i < n; ++i) {
    const Tensor<float>& want = i < a.numel() ? a0 : b0;
    const Tensor<float>& got = i < k ? (i < a.numel() ? a1 : b1) : (i < a.numel() ? a2 : b2);
    const int64_t j = i < a.numel() ? i : i - a.numel();
    EXPECT_EQ(want[j], got[j]) << "element " << i;
  }
  lo.materialize([](std::vector<float>&) {});
  EXPECT_EQ(lo.m()[0][0], full.m()[0][0]);
  EXPECT_EQ(lo.m()[1][0], 0.0f);  // element 12 belongs to the other shard
}

TEST(Train, ResumeIsBitExact) {
  const fs::path base = fs::temp_directory_path() / "nsa_test_resume";
  expect_resume_exact(small_run((base / "unused").string()), base, 3);
}

TEST(Train, RefusesDamagedCheckpointsAndMismatchedConfigs) {
  const fs::path base = fs::temp_directory_path() / "nsa_test_damage";
  TrainOptions o = small_run((base / "run").string());
  o.steps = 2;
  train(o);
  const fs::path model = base / "run" / "ckpt_00000002" / "model.safetensors";
  const std::string bytes = read_file_bytes(model);
  std::ofstream(model, std::ios::binary) << bytes.substr(0, bytes.size() / 2);
  o.resume = true;
  o.steps = 4;
  try {
    train(o);
    FAIL() << "resumed from a truncated checkpoint";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("model.safetensors"), std::string::npos) << e.what();
  }
  std::ofstream(model, std::ios::binary) << bytes;  // repaired
  o.overrides["n_sel"] = "5";
  try {
    train(o);
    FAIL() << "resumed with another config";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("different model config"), std::string::npos);
  }
}

TEST(Train, EvalReproducesTheValidationLossAndPlotIsWritten) {
  const fs::path base = fs::temp_directory_path() / "nsa_test_eval";
  TrainOptions o = small_run((base / "run").string());
  o.steps = 3;
  o.overrides["branches"] = "sel,win";
  const TrainResult r = train(o);
  const EvalResult e = evaluate_checkpoint((base / "run" / "ckpt_00000003").string(), o.data,
                                           o.val_batches, o.batch, 0);
  EXPECT_EQ(e.loss, r.last_val_loss) << "eval must rebuild the same model from the checkpoint";
  EXPECT_EQ(e.step, 3);
  const std::string svg = read_file_bytes(base / "run" / "loss.svg");
  EXPECT_NE(svg.find("<polyline"), std::string::npos);
  size_t circles = 0;
  for (size_t p = svg.find("<circle"); p != std::string::npos; p = svg.find("<circle", p + 1))
    ++circles;
  EXPECT_EQ(circles, 1u);  // one validation (every 3 steps, and the last step)
}

TEST(Train, InitFromStartsAFreshRunFromTheWeights) {
  const fs::path base = fs::temp_directory_path() / "nsa_test_init_from";
  fs::remove_all(base);  // every run below is a fresh run into its own folder
  TrainOptions first = small_run((base / "first").string());
  first.steps = 2;
  train(first);
  const std::string ckpt = (base / "first" / "ckpt_00000002").string();
  // A second stage at learning rate 0 keeps the weights: its checkpoint evaluates as the first's.
  TrainOptions second = small_run((base / "second").string());
  second.init_from = (base / "first").string();  // a run folder: its newest checkpoint
  second.steps = 1;
  second.adam.lr = second.adam.min_lr = 0.0;
  second.overrides["branches"] = "sel,win";  // only the branches may differ
  train(second);
  const EvalResult a = evaluate_checkpoint(ckpt, first.data, 1, 2, 0);
  const EvalResult b =
      evaluate_checkpoint((base / "second" / "ckpt_00000001").string(), first.data, 1, 2, 0);
  EXPECT_EQ(b.step, 1) << "the optimizer and the step start afresh";
  TrainOptions cold = second;  // the same without --init-from: the seed's initial weights
  cold.init_from.clear();
  cold.out_dir = (base / "cold").string();
  train(cold);
  const EvalResult c =
      evaluate_checkpoint((base / "cold" / "ckpt_00000001").string(), first.data, 1, 2, 0);
  second.overrides.erase("branches");
  second.out_dir = (base / "all").string();
  train(second);
  const EvalResult d =
      evaluate_checkpoint((base / "all" / "ckpt_00000001").string(), first.data, 1, 2, 0);
  EXPECT_EQ(d.loss, a.loss) << "the weights of the checkpoint, unchanged at lr 0";
  EXPECT_NE(c.loss, a.loss);
  EXPECT_NE(b.loss, c.loss);
  second.overrides["dim"] = "48";
  second.out_dir = (base / "bad").string();
  try {
    train(second);
    FAIL() << "started from a checkpoint of another shape";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--init-from"), std::string::npos) << e.what();
  }
  second.overrides.erase("dim");
  second.init_from = (base / "nothing").string();
  EXPECT_THROW(train(second), Error);
}

// The three attentions train on the same data; each checkpoint records its attention, and eval
// rebuilds the same model from it (the trainer's validation loss, exactly). A checkpoint written
// before the field existed reads as nsa.
TEST(Train, AttentionModesTrainAndEvalRebuildsThem) {
  const fs::path base = fs::temp_directory_path() / "nsa_test_attention_modes";
  std::map<std::string, double> val;
  for (const char* mode : {"nsa", "full", "window"}) {
    TrainOptions o = small_run((base / mode).string());
    o.overrides["w"] = "8";  // well below S = 48, so window and full differ
    o.overrides["attention"] = mode;
    const TrainResult r = train(o);
    ASSERT_TRUE(std::isfinite(r.last_loss)) << mode;
    const std::string ckpt = (base / mode / "ckpt_00000006").string();
    EXPECT_EQ(read_checkpoint_state(ckpt).model_config.at("attention"), mode);
    const EvalResult e = evaluate_checkpoint(ckpt, o.data, o.val_batches, o.batch, 0);
    EXPECT_EQ(e.loss, r.last_val_loss) << mode << ": eval must rebuild the same model";
    val[mode] = r.last_val_loss;
  }
  EXPECT_NE(val["nsa"], val["full"]);
  EXPECT_NE(val["full"], val["window"]);
  // Resuming or initialising with another attention is another model config.
  TrainOptions other = small_run((base / "other").string());
  other.overrides["w"] = "8";
  other.overrides["attention"] = "full";
  other.init_from = (base / "window").string();
  EXPECT_THROW(train(other), Error);
  // An older checkpoint: state.json without the field.
  const fs::path state = base / "nsa" / "ckpt_00000006" / "state.json";
  std::string text = read_file_bytes(state);
  const std::string field = "\"attention\": \"nsa\",";
  ASSERT_NE(text.find(field), std::string::npos) << text;
  text.erase(text.find(field), field.size());
  std::ofstream(state) << text;
  EXPECT_EQ(read_checkpoint_state(state.parent_path().string()).model_config.at("attention"),
            "nsa");
  EXPECT_EQ(evaluate_checkpoint(state.parent_path().string(), "synthetic", 1, 2, 0).step, 6);
}

TEST(Train, RefusesOutOfVocabularyData) {
  const fs::path dir = fs::temp_directory_path() / "nsa_test_oov";
  fs::remove_all(dir);
  fs::create_directories(dir);
  io::write_token_shard((dir / "train_000000.bin").string(), std::vector<uint32_t>(500, 70));
  TrainOptions o = small_run((dir / "run").string());
  o.data = dir.string();
  try {
    train(o);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("token 70 at index 0"), std::string::npos) << e.what();
  }
  o.data = (dir / "missing").string();
  EXPECT_THROW(train(o), Error);
}

}  // namespace
}  // namespace nsa::test
