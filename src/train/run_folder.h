// The run folder's contract (docs/training.md): one writer at a time, and a folder holds one run.
//
// A run takes an exclusive flock on <out>/run.lock for its whole life; the kernel drops it when
// the process ends in any way, so a crashed run leaves no stale lock. A fresh run (no --resume)
// into a folder that holds another run's metrics or checkpoints is refused, unless --overwrite,
// which clears them once the new run's inputs have been checked. A resumed run's metrics.jsonl is
// cut back to its checkpoint's step, so the steps it repeats after a crash are not recorded twice.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

namespace nsa {

// The held lock on a run folder; released on destruction (or when the process dies). A folder the
// lock created that still holds nothing but run.lock at the end (a run refused for its inputs)
// is removed with it, so that a failed command leaves no folder behind.
class RunFolderLock {
 public:
  RunFolderLock() = default;
  // Creates the folder when needed and locks it, or fails naming the pid of the run holding it.
  explicit RunFolderLock(const std::string& dir);
  ~RunFolderLock();
  RunFolderLock(RunFolderLock&& other) noexcept { *this = std::move(other); }
  RunFolderLock& operator=(RunFolderLock&& other) noexcept;

 private:
  void release() noexcept;
  int fd_ = -1;
  std::string dir_;
  bool created_ = false;  // the folder did not exist before the lock
};

// A locked run folder, and the old run's outputs (metrics, checkpoints, …) that --overwrite
// replaces. They are removed by clear_old_run once the new run's config, data and --init-from
// have been checked, so that a run refused for its inputs loses nothing.
struct RunFolder {
  RunFolderLock lock;
  std::vector<std::filesystem::path> old_outputs;
  void clear_old_run();
};

// Locks `dir` and checks it may take this run: with resume anything goes; otherwise a folder
// with metrics or checkpoints is refused, or with overwrite listed in old_outputs.
RunFolder open_run_folder(const std::string& dir, bool resume, bool overwrite);

// Drops the lines of metrics.jsonl after `step` (and a torn last line), atomically.
void truncate_metrics(const std::string& dir, int64_t step);

}  // namespace nsa
