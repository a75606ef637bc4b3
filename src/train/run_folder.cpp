// The run folder's lock, its fresh-run check and metrics truncation (see run_folder.h).
#include "run_folder.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "io/durable_file.h"
#include "io/paths.h"
#include "nsa/error.h"

namespace nsa {
namespace fs = std::filesystem;
namespace {

// A checkpoint's folder name as save_checkpoint writes it: ckpt_<digits>, or ckpt_<digits>.tmp
// while it is written – not any name that starts with ckpt_ (a user's ckpt_notes/ is theirs).
bool is_checkpoint_name(const std::string& name) {
  if (name.rfind("ckpt_", 0) != 0) return false;
  size_t i = 5;
  while (i < name.size() && name[i] >= '0' && name[i] <= '9') ++i;
  return i > 5 && (i == name.size() || name.substr(i) == ".tmp");
}

// What a run writes into its folder: another run's traces make the folder "in use".
bool is_run_output(const std::string& name) {
  return name == "metrics.jsonl" || name == "loss.svg" || name.rfind("heartbeat", 0) == 0 ||
         name.rfind("loss_by_position.", 0) == 0 ||  // nsa eval --by-position
         name.rfind("stacks", 0) == 0 || is_checkpoint_name(name);
}

}  // namespace

RunFolderLock::RunFolderLock(const std::string& dir) {
  created_ = io::make_out_folder(dir, "--out", "a run folder");
  dir_ = dir;
  const std::string path = (fs::path(dir) / "run.lock").string();
  fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  NSA_CHECK(fd_ >= 0, "cannot open the run folder's lock '", path, "': ", std::strerror(errno));
  if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    char buf[32] = {};
    const ssize_t n = ::pread(fd_, buf, sizeof buf - 1, 0);
    ::close(fd_);
    fd_ = -1;
    const std::string holder = n > 0 ? std::string(buf, static_cast<size_t>(n)) : "";
    NSA_CHECK(err != EWOULDBLOCK, "run folder '", dir, "' is in use by another nsa train (pid ",
              holder.substr(0, holder.find('\n')), "): wait for it to end, or pass another --out");
    throw Error(str("cannot lock the run folder's lock '", path, "': ", std::strerror(err)));
  }
  const std::string pid = std::to_string(::getpid()) + "\n";
  if (::ftruncate(fd_, 0) != 0 ||
      ::pwrite(fd_, pid.data(), pid.size(), 0) != static_cast<ssize_t>(pid.size())) {
    ::close(fd_);
    fd_ = -1;
    throw Error(str("cannot write the run folder's lock '", path, "': ", std::strerror(errno)));
  }
}

RunFolderLock::~RunFolderLock() {
  release();
}

// A folder this lock created and that holds only run.lock goes, the lock file first and while the
// lock is still held (a second run that opened the file meanwhile still finds it locked); then
// closing the descriptor releases the flock.
void RunFolderLock::release() noexcept {
  if (fd_ < 0) return;
  if (created_) {
    std::error_code ec;
    bool only_lock = true;
    for (fs::directory_iterator it(dir_, ec), end; !ec && it != end; it.increment(ec)) {
      if (it->path().filename() != "run.lock") only_lock = false;
    }
    if (!ec && only_lock && fs::remove(fs::path(dir_) / "run.lock", ec)) fs::remove(dir_, ec);
  }
  ::close(fd_);
  fd_ = -1;
}

RunFolderLock& RunFolderLock::operator=(RunFolderLock&& other) noexcept {
  if (this != &other) {
    release();
    fd_ = std::exchange(other.fd_, -1);
    dir_ = std::move(other.dir_);
    created_ = std::exchange(other.created_, false);
  }
  return *this;
}

RunFolder open_run_folder(const std::string& dir, bool resume, bool overwrite) {
  RunFolder folder{RunFolderLock(dir), {}};
  if (resume) return folder;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (is_run_output(e.path().filename().string())) folder.old_outputs.push_back(e.path());
  }
  if (folder.old_outputs.empty()) return folder;
  NSA_CHECK(overwrite, "run folder '", dir, "' already holds a run (",
            folder.old_outputs.front().filename().string(),
            "): pass --resume to continue it, a new --out for a new run, or --overwrite to "
            "replace it");
  return folder;
}

void RunFolder::clear_old_run() {
  for (const fs::path& p : old_outputs) fs::remove_all(p);
  old_outputs.clear();
}

void truncate_metrics(const std::string& dir, int64_t step) {
  const fs::path path = fs::path(dir) / "metrics.jsonl";
  if (!fs::exists(path)) return;
  std::ifstream in(path);
  std::string line, kept;
  while (std::getline(in, line)) {
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.is_object() || !j.contains("step") ||
        !j["step"].is_number_integer() || j["step"].get<int64_t>() > step)
      break;  // a torn line, or the first step after the checkpoint
    kept += line + "\n";
  }
  io::write_file_durably(path.string(), kept);
}

}  // namespace nsa
