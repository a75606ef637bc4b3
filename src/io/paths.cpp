// Path normalisation and containment (see paths.h).
#include "paths.h"

#include <algorithm>
#include <system_error>

#include "nsa/error.h"

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

bool make_out_folder(const std::string& dir, const std::string& flag, const std::string& what) {
  NSA_CHECK(!dir.empty(), flag, " is empty; pass ", what);
  NSA_CHECK(!fs::exists(dir) || fs::is_directory(dir), flag, " '", dir,
            "' exists and is not a folder; pass ", what);
  std::error_code ec;
  const bool created = fs::create_directories(dir, ec);
  NSA_CHECK(!ec, flag, " '", dir, "': cannot create the folder: ", ec.message());
  return created;
}

}  // namespace nsa::io
