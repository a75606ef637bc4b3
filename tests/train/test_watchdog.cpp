// The watchdog: a stalled process writes every thread's stack and the last phase, then exits
// non-zero in bounded time; SIGUSR1 writes a dump and the process goes on.
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

#include "train/watchdog.h"

namespace nsa::test {
namespace {
namespace fs = std::filesystem;

std::string read_all(const fs::path& p) {
  std::ifstream f(p);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

TEST(Watchdog, StallWritesStacksAndExitsNonZero) {
  const fs::path dump = fs::temp_directory_path() / "nsa_test_stall_stacks.txt";
  fs::remove(dump);
  const auto t0 = std::chrono::steady_clock::now();
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    Watchdog w(0.5, dump.string());
    w.progress("pretend-forward");
    std::thread helper([] {  // a second thread whose stack must appear too
      for (;;) sleep(30);
    });
    helper.detach();
    for (;;) sleep(30);  // the stall (a stack-dump signal interrupts sleep: sleep again)
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 3) << "status " << status;
  EXPECT_LT(seconds, 10.0) << "the watchdog must end a stall in bounded time";
  const std::string text = read_all(dump);
  EXPECT_NE(text.find("last phase: pretend-forward"), std::string::npos) << text;
  size_t threads = 0;
  for (size_t p = text.find("--- thread"); p != std::string::npos;
       p = text.find("--- thread", p + 1)) {
    ++threads;
  }
  EXPECT_GE(threads, 2u) << text;
}

TEST(Watchdog, Sigusr1DumpsWithoutStopping) {
  const fs::path dump = fs::temp_directory_path() / "nsa_test_usr1_stacks.txt";
  fs::remove(dump);
  Watchdog w(0, dump.string());
  w.progress("steady");
  raise(SIGUSR1);
  for (int i = 0; i < 100 && read_all(dump).find("end of dump") == std::string::npos; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  const std::string text = read_all(dump);
  EXPECT_NE(text.find("SIGUSR1 stack dump; last phase: steady"), std::string::npos) << text;
  EXPECT_NE(text.find("--- thread"), std::string::npos) << text;
}

}  // namespace
}  // namespace nsa::test
