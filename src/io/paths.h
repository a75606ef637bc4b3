// Paths compared as the file system sees them: two flags that name the same file or folder in
// different spellings (relative, "./x", "x/"), or one inside the other – `prepare`'s inputs given
// twice, a train --init-from inside the --out that --overwrite clears.
#pragma once

#include <filesystem>
#include <string>

namespace nsa::io {

// `p` absolute and normalised, symbolic links resolved where the path exists, without a trailing
// separator ("runs/x/" is "runs/x").
std::filesystem::path normal_path(const std::string& p);

// Whether `p` is `folder` or lies inside it (both normal_path's).
bool lies_within(const std::filesystem::path& p, const std::filesystem::path& folder);

}  // namespace nsa::io
