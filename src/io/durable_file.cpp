// Checked, durable file writes (see durable_file.h).
#include "durable_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <mutex>

#include "nsa/error.h"

namespace nsa::io {
namespace {

struct WriteFault {
  std::mutex mutex;
  bool loaded = false;
  std::string pattern;
  int64_t nth = 0;
};

WriteFault& fault() {
  static WriteFault f;
  return f;
}

// Whether the file being created at `path` is the one the seam makes fail.
bool injected_failure(const std::string& path) {
  WriteFault& f = fault();
  std::lock_guard<std::mutex> lock(f.mutex);
  if (!f.loaded) {
    f.loaded = true;
    const char* env = std::getenv("NSA_TEST_FAIL_WRITE");
    const std::string spec = env ? env : "";
    const size_t colon = spec.rfind(':');
    if (colon != std::string::npos && colon > 0) {
      f.pattern = spec.substr(0, colon);
      f.nth = std::atoll(spec.c_str() + colon + 1);
    }
  }
  if (f.pattern.empty() || f.nth <= 0) return false;
  if (std::filesystem::path(path).filename().string().find(f.pattern) == std::string::npos)
    return false;
  return --f.nth == 0;
}

std::string os_error(int err) {
  return std::strerror(err);
}

}  // namespace

void set_write_fault(const std::string& name_pattern, int64_t nth) {
  WriteFault& f = fault();
  std::lock_guard<std::mutex> lock(f.mutex);
  f.loaded = true;
  f.pattern = name_pattern;
  f.nth = nth;
}

DurableFile::DurableFile(const std::string& path) : path_(path) {
  NSA_CHECK(!std::filesystem::is_directory(path), "cannot write '", path, "': it is a folder");
  fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  NSA_CHECK(fd_ >= 0, "cannot create '", path, "': ", os_error(errno));
  doomed_ = injected_failure(path);
}

DurableFile::~DurableFile() {
  if (fd_ >= 0) ::close(fd_);
}

void DurableFile::write(const void* data, int64_t bytes) {
  const char* p = static_cast<const char*>(data);
  if (doomed_) {
    throw Error(str("writing '", path_, "' failed: ", os_error(ENOSPC), " (injected by the test ",
                    "seam NSA_TEST_FAIL_WRITE)"));
  }
  while (bytes > 0) {
    const ssize_t n = ::write(fd_, p, static_cast<size_t>(std::min<int64_t>(bytes, 1 << 30)));
    if (n < 0 && errno == EINTR) continue;
    NSA_CHECK(n > 0, "writing '", path_, "' failed: ", os_error(n < 0 ? errno : ENOSPC),
              " (disk full?)");
    p += n;
    bytes -= n;
  }
}

void DurableFile::close() {
  NSA_CHECK(::fsync(fd_) == 0, "flushing '", path_, "' to disk (fsync) failed: ", os_error(errno));
  const int fd = fd_;
  fd_ = -1;
  NSA_CHECK(::close(fd) == 0, "closing '", path_, "' failed: ", os_error(errno));
}

void write_file_durably(const std::string& path, const std::string& contents) {
  const std::string tmp = path + ".tmp";
  try {
    DurableFile f(tmp);
    f.write(contents.data(), static_cast<int64_t>(contents.size()));
    f.close();
    NSA_CHECK(std::rename(tmp.c_str(), path.c_str()) == 0, "cannot rename '", tmp, "' to '", path,
              "': ", os_error(errno));
  } catch (...) {
    std::remove(tmp.c_str());
    throw;
  }
}

void sync_directory(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  NSA_CHECK(fd >= 0, "cannot open folder '", dir, "' to sync it: ", os_error(errno));
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  NSA_CHECK(rc == 0, "flushing folder '", dir, "' to disk (fsync) failed: ", os_error(err));
}

}  // namespace nsa::io
