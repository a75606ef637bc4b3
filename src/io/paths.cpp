// Path normalisation and containment (see paths.h).
#include "paths.h"

#include <algorithm>
#include <system_error>

namespace nsa::io {
namespace fs = std::filesystem;

fs::path normal_path(const std::string& p) {
  std::error_code ec;
  fs::path a = fs::weakly_canonical(fs::absolute(p), ec);
  if (ec) a = fs::absolute(p);
  a = a.lexically_normal();
  return a.has_filename() ? a : a.parent_path();
}

bool lies_within(const fs::path& p, const fs::path& folder) {
  return std::mismatch(folder.begin(), folder.end(), p.begin(), p.end()).first == folder.end();
}

}  // namespace nsa::io
