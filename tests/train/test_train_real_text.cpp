// End to end on real English: prepare Alice in Wonderland (../shared/data, when beside the
// checkout) as bytes, train the tiny config for 300 steps on the CPU, and require the validation
// loss to fall well below the unigram baseline (the entropy of the training bytes): a model that
// only learned byte frequencies would sit at the baseline. Own executable and CTest label
// ("train") so the sanitizer build does not run it.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>

#include "data/prepare.h"
#include "io/token_shard.h"
#include "train/trainer.h"

namespace nsa::test {
namespace {
namespace fs = std::filesystem;

TEST(TrainRealText, TinyModelBeatsTheUnigramBaseline) {
  std::string alice;
  for (const char* p : {"../shared/data/gutenberg/carroll-alice.txt",
                        "../../shared/data/gutenberg/carroll-alice.txt",
                        "../../../shared/data/gutenberg/carroll-alice.txt"}) {
    if (fs::exists(p)) alice = p;
  }
  if (alice.empty()) {
    std::printf("SKIPPED: ../shared/data not found beside the checkout\n");
    GTEST_SKIP();
  }
  const fs::path dir = fs::temp_directory_path() / "nsa_test_real_text";
  fs::remove_all(dir);
  data::PrepareOptions prep;
  prep.inputs = {alice};
  prep.out_dir = (dir / "data").string();
  prep.tokenizer = "bytes";
  prep.val_fraction = 0.05;
  const data::PrepareResult pr = data::prepare_corpus(prep);

  std::map<uint32_t, double> counts;
  for (const auto& s : pr.train_shards) {
    for (uint32_t t : io::read_token_shard(s)) counts[t] += 1;
  }
  double unigram = 0;
  for (const auto& [tok, c] : counts) {
    const double p = c / static_cast<double>(pr.train_tokens);
    unigram -= p * std::log(p);
  }

  TrainOptions o;
  o.config = std::string(NSA_SOURCE_DIR) + "/configs/tiny.yaml";
  o.data = prep.out_dir;
  o.out_dir = (dir / "run").string();
  o.steps = 300;
  o.adam.lr = 1e-2;
  o.adam.min_lr = 1e-3;
  o.batch = 8;
  o.seq_len = 128;
  o.val_every = 50;
  o.val_batches = 4;
  o.ckpt_every = 0;
  o.quiet = true;
  const TrainResult r = train(o);
  std::printf("  unigram baseline %.3f nats, validation loss after %lld steps %.3f\n", unigram,
              static_cast<long long>(r.steps_done), r.last_val_loss);
  EXPECT_LT(r.last_val_loss, unigram - 0.3);
}

}  // namespace
}  // namespace nsa::test
