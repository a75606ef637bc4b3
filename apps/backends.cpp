// The backend registry (see backends.h) and its messages: a backend the build lacks, no GPU.
#include "backends.h"

#include "nsa/error.h"

namespace nsa::app {
namespace {

std::vector<Backend>& registry() {
  static std::vector<Backend> backends;
  return backends;
}

}  // namespace

bool register_backend(Backend backend) {
  registry().push_back(std::move(backend));
  return true;
}

const Backend* find_backend(const std::string& name) {
  for (const Backend& b : registry()) {
    if (b.name == name) return &b;
  }
  return nullptr;
}

const Backend& backend(const std::string& device, const std::string& command) {
  if (device == "auto") {
    const Backend* gpu = find_backend("cuda");
    return gpu && gpu->device_count() > 0 ? *gpu : backend("cpu", command);
  }
  const Backend* b = find_backend(device);
  NSA_CHECK(
      b, command, " --device ", device, ": this build has no ",
      device == "cuda" ? "CUDA backend (no CUDA toolkit at build time)" : "backend of that name");
  // Up front, before a command reads data, runs a baseline or prints a table header.
  NSA_CHECK(device != "cuda" || b->device_count() > 0, command,
            " --device cuda: no usable CUDA device (no GPU or no driver)");
  return *b;
}

}  // namespace nsa::app
