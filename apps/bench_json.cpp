// See bench_json.h.
#include "bench_json.h"

#include "nsa/error.h"

namespace nsa::app {

std::unique_ptr<std::ofstream> open_json_lines(const std::string& path) {
  if (path.empty()) return nullptr;
  auto file = std::make_unique<std::ofstream>(path);
  NSA_CHECK(*file, "cannot write --json file '", path, "'");
  return file;
}

}  // namespace nsa::app
