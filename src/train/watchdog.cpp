// Stall watchdog and stack dumps (see watchdog.h).
#include "watchdog.h"

#include <dirent.h>
#include <execinfo.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>

#include "nsa/error.h"

namespace nsa {
namespace {

// State shared with the signal handlers (async-signal-safe use only: fds, atomics, write()).
std::atomic<int> g_dump_fd{-1};
std::atomic<int> g_pending{0};    // threads that still have to write their stack
std::atomic<bool> g_usr1{false};  // SIGUSR1 seen, the watchdog thread should dump
std::atomic<Watchdog*> g_active{nullptr};

long long now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

void write_str(int fd, const char* s) {
  if (write(fd, s, strlen(s)) < 0) return;
}

void on_stack_request(int) {
  const int fd = g_dump_fd.load();
  if (fd >= 0) {
    char head[64];
    // snprintf is not formally async-signal-safe; a fixed-width decimal by hand is.
    long tid = static_cast<long>(syscall(SYS_gettid));
    char digits[24];
    int n = 0;
    do digits[n++] = static_cast<char>('0' + tid % 10), tid /= 10;
    while (tid > 0 && n < 20);
    int k = 0;
    for (const char* p = "\n--- thread "; *p;) head[k++] = *p++;
    while (n > 0) head[k++] = digits[--n];
    head[k++] = '\n';
    if (write(fd, head, static_cast<size_t>(k)) < 0) return;
    void* frames[64];
    const int depth = backtrace(frames, 64);
    backtrace_symbols_fd(frames, depth, fd);
  }
  g_pending.fetch_sub(1);
}

void on_usr1(int) {
  g_usr1.store(true);
}

}  // namespace

Watchdog::Watchdog(double timeout_s, std::string dump_path)
    : timeout_s_(timeout_s), dump_path_(std::move(dump_path)), last_ns_(now_ns()) {
  Watchdog* expected = nullptr;
  NSA_CHECK(g_active.compare_exchange_strong(expected, this), "only one Watchdog at a time");
  void* warm[4];
  backtrace(warm, 4);  // loads the unwinder now, not inside a signal handler
  struct sigaction sa {};
  sa.sa_handler = on_stack_request;
  sa.sa_flags = SA_RESTART;
  sigaction(SIGURG, &sa, nullptr);
  sa.sa_handler = on_usr1;
  sigaction(SIGUSR1, &sa, nullptr);
  thread_ = std::thread([this] { run(); });
}

Watchdog::~Watchdog() {
  stop_.store(true);
  thread_.join();
  signal(SIGUSR1, SIG_DFL);
  g_active.store(nullptr);
}

void Watchdog::progress(const char* phase) {
  phase_.store(phase);
  last_ns_.store(now_ns());
}

void Watchdog::dump(const char* reason) {
  const int fd = open(dump_path_.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
  if (fd < 0) return;
  char line[256];
  std::snprintf(line, sizeof line, "=== %s; last phase: %s; %.1f s since the last progress\n",
                reason, phase_.load(), static_cast<double>(now_ns() - last_ns_.load()) / 1e9);
  write_str(fd, line);
  g_dump_fd.store(fd);
  const pid_t pid = getpid();
  const pid_t self = static_cast<pid_t>(syscall(SYS_gettid));
  if (DIR* dir = opendir("/proc/self/task")) {
    while (dirent* e = readdir(dir)) {
      if (e->d_name[0] == '.') continue;
      const pid_t tid = static_cast<pid_t>(atoi(e->d_name));
      if (tid == self) continue;
      g_pending.store(1);
      if (syscall(SYS_tgkill, pid, tid, SIGURG) != 0) continue;
      for (int i = 0; i < 200 && g_pending.load() > 0; ++i) usleep(5000);  // ≤ 1 s per thread
    }
    closedir(dir);
  }
  write_str(fd, "=== end of dump\n");
  g_dump_fd.store(-1);
  close(fd);
}

void Watchdog::run() {
  while (!stop_.load()) {
    usleep(50000);
    if (g_usr1.exchange(false)) dump("SIGUSR1 stack dump");
    const double idle = static_cast<double>(now_ns() - last_ns_.load()) / 1e9;
    if (timeout_s_ > 0 && idle > timeout_s_) {
      char reason[128];
      std::snprintf(reason, sizeof reason, "watchdog: no progress for %.1f s (timeout %.1f s)",
                    idle, timeout_s_);
      dump(reason);
      const std::string note = note_ ? note_() : std::string();
      std::fprintf(stderr, "nsa: error: %s in phase '%s'%s; stacks of all threads in %s\n", reason,
                   phase_.load(), note.c_str(), dump_path_.c_str());
      std::fflush(stderr);
      _exit(3);
    }
  }
}

}  // namespace nsa
