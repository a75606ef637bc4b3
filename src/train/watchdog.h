// Never silent (docs/training.md): a watchdog that notices a stalled step and a SIGUSR1 stack dump.
//
// The training loop reports progress (and the phase it is in: "forward", "optimizer", ...). A
// background thread checks the time since the last report; past the timeout it writes the stack
// of every thread of the process and the last phase to the dump file and exits the process with
// status 3 – a hang becomes a failure with a diagnosis. SIGUSR1 asks the same thread for a dump
// at any time without stopping. Stacks are collected by signalling each thread (from
// /proc/self/task) with SIGURG, whose handler writes its own backtrace (glibc's backtrace, warmed
// up beforehand) to the dump file.
#pragma once

#include <atomic>
#include <functional>
#include <string>
#include <thread>

namespace nsa {

class Watchdog {
 public:
  // timeout_s <= 0 disables the stall check (SIGUSR1 dumps still work).
  Watchdog(double timeout_s, std::string dump_path);
  ~Watchdog();
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  // Records progress; `phase` must be a string literal (kept by pointer).
  void progress(const char* phase);
  // Writes all threads' stacks and `reason` to the dump file now (also what SIGUSR1 does).
  void dump(const char* reason);
  const std::string& dump_path() const { return dump_path_; }
  // Extra text for the stall message (multi-rank runs: which rank the others wait for). Set
  // before the first progress() report.
  void set_stall_note(std::function<std::string()> note) { note_ = std::move(note); }

 private:
  void run();
  double timeout_s_;
  std::string dump_path_;
  std::atomic<long long> last_ns_;
  std::atomic<const char*> phase_{"start"};
  std::atomic<bool> stop_{false};
  std::function<std::string()> note_;
  std::thread thread_;
};

}  // namespace nsa
