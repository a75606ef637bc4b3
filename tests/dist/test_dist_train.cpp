// Data-parallel training on the CPU, end to end through the `nsa` binary, over MPI (`--nproc`)
// and over TCP (ranks started with torchrun's environment): 2 ranks with batch B against 1 rank
// with batch 2B, exact resume across ranks, and the failure contract – a rank that dies or
// stalls, or was started with other flags, ends the whole job non-zero, in bounded time, with a
// message naming it.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "resume_check.h"
#include "run_command.h"
#include "train/checkpoint.h"
#include "train/trainer.h"

namespace nsa::test {
namespace {
namespace fs = std::filesystem;

// A small model on synthetic tokens; `extra` adds flags.
std::string train_cmd(const fs::path& out, int64_t batch, const std::string& extra) {
  return std::string("timeout 120 ") + NSA_BINARY + " train --config " + NSA_SOURCE_DIR +
         "/configs/tiny.yaml --set dim=32 --set n_layers=2 --set seq_len=64 --data synthetic" +
         " --steps 6 --val-every 3 --val-batches 2 --ckpt-every 3 --batch " +
         std::to_string(batch) + " --out " + out.string() + " " + extra;
}

std::vector<double> metric(const fs::path& run_dir, const std::string& field) {
  std::ifstream f(run_dir / "metrics.jsonl");
  std::vector<double> out;
  std::string line;
  const std::string key = "\"" + field + "\":";
  while (std::getline(f, line)) {
    const size_t at = line.find(key);
    if (at != std::string::npos) out.push_back(std::stod(line.substr(at + key.size())));
  }
  return out;
}

fs::path base_dir(const char* name) {
  const fs::path p = fs::temp_directory_path() / name;
  fs::remove_all(p);
  return p;
}

// A run of 2 ranks (in two) against one of 1 rank with twice the batch (in one): the same
// losses and weights up to the fp32 order of summing the ranks' gradients.
void expect_same_as_one_rank(const fs::path& one, const fs::path& two) {
  for (const char* field : {"loss", "val_loss", "grad_norm"}) {
    const std::vector<double> a = metric(one, field), b = metric(two, field);
    ASSERT_EQ(a.size(), b.size()) << field;
    ASSERT_FALSE(a.empty()) << field;
    for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], b[i], 1e-5 * std::abs(a[i])) << field;
  }
  ModelConfig cfg = load_model_config(std::string(NSA_SOURCE_DIR) + "/configs/tiny.yaml");
  set_model_field(cfg, "dim", "32");
  set_model_field(cfg, "n_layers", "2");
  ModelParams<float> pa = init_model_params<float>(cfg), pb = init_model_params<float>(cfg);
  load_model_weights((one / "ckpt_00000006").string(), pa.named(cfg));
  load_model_weights((two / "ckpt_00000006").string(), pb.named(cfg));
  const auto na = pa.named(cfg), nb = pb.named(cfg);
  double worst = 0;
  for (size_t i = 0; i < na.size(); ++i) {
    double d = 0, r = 0;
    for (int64_t j = 0; j < na[i].second->numel(); ++j) {
      const double x = (*na[i].second)[j], y = (*nb[i].second)[j];
      d += (x - y) * (x - y), r += x * x;
    }
    worst = std::max(worst, std::sqrt(d / r));
  }
  std::printf("  weights after 6 steps: worst relative L2 difference %.2e\n", worst);
  EXPECT_LT(worst, 1e-5);
}

// Two 6-step runs ended in byte-identical weights and moments and the same final loss.
void expect_same_final_state(const fs::path& a, const fs::path& b) {
  for (const char* file : {"model.safetensors", "optimizer.safetensors"}) {
    EXPECT_EQ(read_file_bytes(a / "ckpt_00000006" / file),
              read_file_bytes(b / "ckpt_00000006" / file))
        << file;
  }
  EXPECT_EQ(metric(a, "loss"), metric(b, "loss"));
}

TEST(DistTrain, TwoRanksWithBatchBEqualOneRankWithBatch2B) {
  const fs::path base = base_dir("nsa_dist_equiv");
  const Outcome one = run(train_cmd(base / "one", 4, ""));
  ASSERT_EQ(one.rc, 0) << one.output;
  const Outcome two = run(train_cmd(base / "two", 2, "--nproc 2"));
  ASSERT_EQ(two.rc, 0) << two.output;
  expect_same_as_one_rank(base / "one", base / "two");
}

// A free TCP port on this machine (another program may take it before we do: rare).
int free_port() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa);
  socklen_t len = sizeof sa;
  getsockname(fd, reinterpret_cast<sockaddr*>(&sa), &len);
  close(fd);
  return ntohs(sa.sin_port);
}

// Two ranks started as torchrun starts them (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT; no MPI):
// rank 0's output goes to `log0`, the command's to the outcome; exit status: both ranks' OR'd.
Outcome run_torchrun_style(const std::string& rank0, const std::string& rank1,
                           const fs::path& log0) {
  const std::string e =
      "WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=" + std::to_string(free_port()) + " ";
  Outcome r = run("sh -c '" + e + "RANK=0 " + rank0 + " >" + log0.string() + " 2>&1 & p=$!; " + e +
                  "RANK=1 " + rank1 + "; r1=$?; wait $p; r0=$?; exit $((r0 | r1))'");
  std::ifstream f(log0);
  r.output += std::string(std::istreambuf_iterator<char>(f), {});
  return r;
}

TEST(DistTrain, TorchrunStyleRanksOverTcpEqualOneRank) {
  const fs::path base = base_dir("nsa_dist_tcp");
  ASSERT_EQ(run(train_cmd(base / "one", 4, "")).rc, 0);
  fs::create_directories(base);
  const std::string cmd = train_cmd(base / "two", 2, "");
  const Outcome two = run_torchrun_style(cmd, cmd, base / "rank0.txt");
  ASSERT_EQ(two.rc, 0) << two.output;
  expect_same_as_one_rank(base / "one", base / "two");
}

TEST(DistTrain, ADeadTcpRankEndsTheJob) {
  const fs::path base = base_dir("nsa_dist_tcp_dead");
  fs::create_directories(base);
  const std::string cmd = train_cmd(base / "run", 2, "--fault exit --fault-rank 1 --fault-step 3");
  const Outcome r = run_torchrun_style(cmd, cmd, base / "rank0.txt");
  std::printf("  exit %d after %.1f s\n", r.rc, r.seconds);
  EXPECT_NE(r.rc, 0);
  EXPECT_LT(r.seconds, 60);
  EXPECT_NE(r.output.find("rank 0: lost rank 1 during allreduce"), std::string::npos) << r.output;
}

// `--nproc` without MPI (NSA_LAUNCHER=tcp; also what happens where mpirun is missing): the
// launcher's children meet over TCP; the same run as 1 rank with 2B, and a failing child stops
// the job with its status.
TEST(DistTrain, BuiltInTcpLauncherRunsAndStopsTheJob) {
  const fs::path base = base_dir("nsa_dist_tcp_launcher");
  ASSERT_EQ(run(train_cmd(base / "one", 4, "")).rc, 0);
  const Outcome two = run("NSA_LAUNCHER=tcp " + train_cmd(base / "two", 2, "--nproc 2"));
  ASSERT_EQ(two.rc, 0) << two.output;
  expect_same_as_one_rank(base / "one", base / "two");
  // ZeRO-1 (the moments' all-gather over TCP) and a resume: byte-identical to the plain run.
  const std::string tcp = "NSA_LAUNCHER=tcp ";
  ASSERT_EQ(run(tcp + train_cmd(base / "zero1", 2, "--nproc 2 --zero1 --stop-after 3")).rc, 0);
  const Outcome resumed = run(tcp + train_cmd(base / "zero1", 2, "--nproc 2 --zero1 --resume"));
  ASSERT_EQ(resumed.rc, 0) << resumed.output;
  expect_same_final_state(base / "two", base / "zero1");
  const Outcome dead = run("NSA_LAUNCHER=tcp " + train_cmd(base / "dead", 2,
                                                           "--nproc 2 --fault exit --fault-rank 1 "
                                                           "--fault-step 3"));
  std::printf("  exit %d after %.1f s\n", dead.rc, dead.seconds);
  EXPECT_EQ(dead.rc, 17);
  EXPECT_LT(dead.seconds, 60);
  EXPECT_NE(dead.output.find("rank 1 exited with status 17; stopping the others"),
            std::string::npos)
      << dead.output;
  const Outcome stalled =
      run("NSA_LAUNCHER=tcp " + train_cmd(base / "stall", 2,
                                          "--nproc 2 --watchdog 3 --fault stall --fault-rank 1 "
                                          "--fault-step 3"));
  EXPECT_NE(stalled.rc, 0);
  EXPECT_LT(stalled.seconds, 60);
  // Whichever watchdog fires first names rank 1 in its forward (the launcher then stops the rest).
  EXPECT_TRUE(stalled.output.find("rank 1 at step/phase '3 forward+backward'") !=
                  std::string::npos ||
              stalled.output.find("this is rank 1 at '3 forward+backward'") != std::string::npos)
      << stalled.output;
  const Outcome mismatch =
      run_torchrun_style(train_cmd(base / "mm", 2, "--lr 1e-3"),
                         train_cmd(base / "mm", 2, "--lr 2e-3"), base / "rank0.txt");
  EXPECT_NE(mismatch.rc, 0);
  EXPECT_NE(mismatch.output.find("rank 1 was started with a different model config"),
            std::string::npos)
      << mismatch.output;
}

TEST(DistTrain, TcpRendezvousErrorsNameTheProblem) {
  const fs::path base = base_dir("nsa_dist_tcp_bad");
  const std::string cmd = train_cmd(base, 2, "");
  const Outcome alone =
      run("RANK=1 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=" + std::to_string(free_port()) +
          " NSA_RENDEZVOUS_TIMEOUT=1 " + cmd);
  EXPECT_NE(alone.rc, 0);
  EXPECT_NE(alone.output.find("rank 1: could not reach rank 0 at 127.0.0.1:"), std::string::npos)
      << alone.output;
  const Outcome no_addr = run("RANK=0 WORLD_SIZE=2 MASTER_PORT=1234 " + cmd);
  EXPECT_NE(no_addr.output.find("MASTER_ADDR is not set"), std::string::npos) << no_addr.output;
  const Outcome bad_port = run("RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=x " + cmd);
  EXPECT_NE(bad_port.output.find("MASTER_PORT='x' is not a non-negative integer"),
            std::string::npos)
      << bad_port.output;
}

TEST(DistTrain, ResumeAcrossRanksIsExact) {
  const fs::path base = base_dir("nsa_dist_resume");
  ASSERT_EQ(run(train_cmd(base / "straight", 2, "--nproc 2")).rc, 0);
  ASSERT_EQ(run(train_cmd(base / "split", 2, "--nproc 2 --stop-after 3")).rc, 0);
  const Outcome resumed = run(train_cmd(base / "split", 2, "--nproc 2 --resume"));
  ASSERT_EQ(resumed.rc, 0) << resumed.output;
  expect_same_final_state(base / "straight", base / "split");
}

// ZeRO-1 shards the AdamW moments; every element sees the same arithmetic, so the run is
// bit-identical to plain data parallelism, and its checkpoints (moments gathered) are the same
// files – a sharded run resumes exactly, from its own checkpoints or a plain run's.
TEST(DistTrain, Zero1IsBitIdenticalToPlainAndResumes) {
  const fs::path base = base_dir("nsa_dist_zero1");
  ASSERT_EQ(run(train_cmd(base / "plain", 2, "--nproc 2")).rc, 0);
  ASSERT_EQ(run(train_cmd(base / "zero1", 2, "--nproc 2 --zero1 --stop-after 3")).rc, 0);
  const Outcome resumed = run(train_cmd(base / "zero1", 2, "--nproc 2 --zero1 --resume"));
  ASSERT_EQ(resumed.rc, 0) << resumed.output;
  expect_same_final_state(base / "plain", base / "zero1");
}

TEST(DistTrain, ADeadRankEndsTheJob) {
  const fs::path base = base_dir("nsa_dist_dead");
  const Outcome r = run(train_cmd(base, 2, "--nproc 2 --fault exit --fault-rank 1 --fault-step 3"));
  std::printf("  exit %d after %.1f s\n", r.rc, r.seconds);
  EXPECT_NE(r.rc, 0);
  EXPECT_LT(r.seconds, 60);
  EXPECT_NE(r.output.find(",1]"), std::string::npos) << "mpirun should name rank 1:\n" << r.output;
  EXPECT_NE(r.output.find("Exit code:    17"), std::string::npos) << r.output;
}

TEST(DistTrain, AStalledRankIsNamedAndEndsTheJob) {
  const fs::path base = base_dir("nsa_dist_stall");
  const Outcome r =
      run(train_cmd(base, 2, "--nproc 2 --watchdog 3 --fault stall --fault-rank 1 --fault-step 3"));
  std::printf("  exit %d after %.1f s\n", r.rc, r.seconds);
  EXPECT_NE(r.rc, 0);
  EXPECT_LT(r.seconds, 60);
  EXPECT_NE(r.output.find("rank 1 at step/phase '3 forward+backward'"), std::string::npos)
      << r.output;
}

TEST(DistTrain, RanksWithDifferentFlagsAreRefused) {
  const fs::path base = base_dir("nsa_dist_mismatch");
  const std::string root = geteuid() == 0 ? " --allow-run-as-root" : "";
  const Outcome r = run(std::string("timeout 120 mpirun") + root + " --oversubscribe -np 1 " +
                        train_cmd(base, 2, "--lr 1e-3").substr(12) + " : -np 1 " +
                        train_cmd(base, 2, "--lr 2e-3").substr(12));
  EXPECT_NE(r.rc, 0);
  EXPECT_NE(r.output.find("rank 1 was started with a different model config or training options"),
            std::string::npos)
      << r.output;
}

}  // namespace
}  // namespace nsa::test
