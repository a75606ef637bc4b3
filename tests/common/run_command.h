// Runs a shell command for the end-to-end tests of the `nsa` binary: its exit status, its output
// (stdout and stderr together) and how long it took.
#pragma once

#include <gtest/gtest.h>
#include <sys/wait.h>

#include <chrono>
#include <cstdio>
#include <string>

namespace nsa::test {

struct Outcome {
  int rc;
  std::string output;
  double seconds;
};

inline Outcome run(const std::string& cmd) {
  const auto t0 = std::chrono::steady_clock::now();
  FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  EXPECT_NE(p, nullptr);
  Outcome r{-1, "", 0};
  if (!p) return r;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) r.output.append(buf, n);
  const int status = pclose(p);
  r.rc = WIFEXITED(status) ? WEXITSTATUS(status) : 128;
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

}  // namespace nsa::test
