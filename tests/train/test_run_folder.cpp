// Reliability of a run folder: a write that fails mid-checkpoint (a full disk, injected through
// the io seam) leaves the previous checkpoint complete and the run resumable; a fresh run never
// mixes with an old one; one writer at a time; a resumed run's metrics end at its checkpoint.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <utility>

#include "../common/test_util.h"
#include "io/durable_file.h"
#include "nsa/error.h"
#include "resume_check.h"
#include "train/checkpoint.h"
#include "train/run_folder.h"
#include "train/trainer.h"

namespace nsa::test {
namespace {
namespace fs = std::filesystem;

TrainOptions tiny_run(const fs::path& out) {
  TrainOptions o = tiny_train_options(out, 2);
  o.ckpt_every = 1;
  o.keep = 1;
  return o;
}

int64_t metrics_lines(const fs::path& run) {
  std::ifstream f(run / "metrics.jsonl");
  std::string line;
  int64_t n = 0;
  while (std::getline(f, line)) ++n;
  return n;
}

TEST(Checkpoint, AFailedWriteKeepsThePreviousCheckpointAndResumes) {
  // The 2nd checkpoint fails at each of its files in turn: the 1st stays complete and is kept.
  for (const char* file :
       {"model.safetensors", "optimizer.safetensors", "state.json", "COMPLETE"}) {
    const fs::path run = fs::temp_directory_path() / "nsa_test_disk_full";
    TrainOptions o = tiny_run(run);
    io::set_write_fault(file, 2);
    const std::string err = error_of([&] { train(o); });
    io::set_write_fault("", 0);
    EXPECT_NE(err.find(file), std::string::npos) << file << ": " << err;
    EXPECT_TRUE(fs::exists(run / "ckpt_00000001" / "COMPLETE")) << file;
    EXPECT_FALSE(fs::exists(run / "ckpt_00000002")) << file;
    EXPECT_FALSE(fs::exists(run / "ckpt_00000002.tmp")) << file;
    EXPECT_EQ(latest_checkpoint(run.string()), (run / "ckpt_00000001").string());
    EXPECT_EQ(metrics_lines(run), 2) << "step 2 ran before its checkpoint failed";
    o.resume = true;
    EXPECT_EQ(train(o).steps_done, 2) << file;
    EXPECT_EQ(metrics_lines(run), 2) << "resume cut step 2's first line: it is written once";
    EXPECT_TRUE(fs::exists(run / "ckpt_00000002" / "COMPLETE"));
    EXPECT_FALSE(fs::exists(run / "ckpt_00000001")) << "--keep 1 prunes after a verified save";
  }
}

TEST(RunFolder, AFreshRunIntoAnOldRunIsRefusedOrOverwritten) {
  const fs::path run = fs::temp_directory_path() / "nsa_test_fresh_into_old";
  TrainOptions o = tiny_run(run);
  o.steps = 1;
  train(o);
  const std::string err = error_of([&] { train(o); });
  EXPECT_NE(err.find("already holds a run"), std::string::npos) << err;
  EXPECT_NE(err.find("--resume"), std::string::npos) << err;
  EXPECT_NE(err.find("new --out"), std::string::npos) << err;
  EXPECT_TRUE(fs::exists(run / "ckpt_00000001" / "COMPLETE")) << "the old run is untouched";
  o.overwrite = true;
  o.steps = 2;
  o.ckpt_every = 2;
  train(o);
  EXPECT_EQ(metrics_lines(run), 2);
  EXPECT_FALSE(fs::exists(run / "ckpt_00000001")) << "the old run's checkpoints went";
}

TEST(RunFolder, OneWriterAtATimeAndNoStaleLock) {
  const fs::path dir = fs::temp_directory_path() / "nsa_test_lock";
  fs::remove_all(dir);
  {
    RunFolderLock held(dir.string());
    try {
      RunFolderLock second(dir.string());
      FAIL() << "two writers";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(str("pid ", getpid(), ")")), std::string::npos)
          << e.what();
    }
    TrainOptions o = tiny_run(dir / "unused");
    o.out_dir = dir.string();
    EXPECT_NE(error_of([&] { train(o); }).find("in use by another nsa train"), std::string::npos);
  }
  RunFolderLock after(dir.string());  // released with its holder
  // A holder that dies without unlocking leaves no stale lock behind.
  const fs::path dead = dir / "dead";
  const pid_t child = fork();
  if (child == 0) {
    RunFolderLock lock(dead.string());
    _exit(0);
  }
  int status = 0;
  waitpid(child, &status, 0);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  EXPECT_NO_THROW(RunFolderLock(dead.string()));
}

// A folder the lock created and nothing else wrote into (a run refused for its inputs) goes with
// the lock; a folder that existed before, or that holds a run's output, stays; a moved lock
// releases once.
TEST(RunFolder, ARefusedRunLeavesNoFolderItCreated) {
  const fs::path dir = fs::temp_directory_path() / "nsa_test_refused_new";
  fs::remove_all(dir);
  {
    RunFolderLock lock(dir.string());
    EXPECT_TRUE(fs::exists(dir / "run.lock"));
    RunFolderLock moved = std::move(lock);
  }
  EXPECT_FALSE(fs::exists(dir)) << "created, nothing written: removed with its lock";
  fs::create_directories(dir);
  { RunFolderLock lock(dir.string()); }
  EXPECT_TRUE(fs::exists(dir)) << "a folder the user made stays";
  fs::remove_all(dir);
  {
    RunFolderLock lock(dir.string());
    std::ofstream(dir / "metrics.jsonl") << "{}\n";
  }
  EXPECT_TRUE(fs::exists(dir / "metrics.jsonl")) << "a folder holding a run's output stays";
  fs::remove_all(dir);
}

TEST(RunFolder, TruncateMetricsKeepsTheCheckpointedSteps) {
  const fs::path dir = fs::temp_directory_path() / "nsa_test_truncate_metrics";
  fs::remove_all(dir);
  fs::create_directories(dir);
  {
    std::ofstream f(dir / "metrics.jsonl");
    for (int s = 1; s <= 5; ++s) f << "{\"step\":" << s << ",\"loss\":1}\n";
    f << "{\"step\":6,\"lo";  // torn by a crash
  }
  truncate_metrics(dir.string(), 3);
  EXPECT_EQ(read_file_bytes(dir / "metrics.jsonl"),
            "{\"step\":1,\"loss\":1}\n{\"step\":2,\"loss\":1}\n{\"step\":3,\"loss\":1}\n");
}

}  // namespace
}  // namespace nsa::test
