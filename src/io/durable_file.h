// Checked, durable file writes. A full disk or a failing device must never pass for a finished
// file: every write, fsync and close is checked and its failure is an nsa::Error naming the file.
// Files are fsynced before they are renamed into place, and sync_directory() makes the renames
// themselves durable.
//
// Test seam: set_write_fault("state.json", 2) – or NSA_TEST_FAIL_WRITE=state.json:2 in the
// environment – makes the first write to the 2nd file created whose name contains "state.json"
// fail with ENOSPC, the way a disk that fills up mid-checkpoint does.
#pragma once

#include <cstdint>
#include <string>

namespace nsa::io {

// A file being written: created (or truncated) on construction; close() fsyncs and closes it.
// Destroyed without close() (an error on its way), it closes the descriptor unchecked.
class DurableFile {
 public:
  explicit DurableFile(const std::string& path);
  ~DurableFile();
  DurableFile(const DurableFile&) = delete;
  DurableFile& operator=(const DurableFile&) = delete;

  void write(const void* data, int64_t bytes);
  void close();

 private:
  std::string path_;
  int fd_ = -1;
  bool doomed_ = false;  // the test seam picked this file: its first write fails
};

// Writes `contents` to path.tmp, fsyncs it and renames it to path (atomic replacement).
void write_file_durably(const std::string& path, const std::string& contents);
// fsyncs a folder, so the names created or renamed in it survive a crash.
void sync_directory(const std::string& dir);

// The test seam (see above); an empty pattern turns it off.
void set_write_fault(const std::string& name_pattern, int64_t nth);

}  // namespace nsa::io
