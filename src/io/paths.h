// Paths compared as the file system sees them: two flags that name the same file or folder in
// different spellings (relative, "./x", "x/"), or one inside the other – `prepare`'s inputs given
// twice, a train --init-from inside the --out that --overwrite clears; and the --out folder of
// `train` and `prepare`, made with the same checks.
#pragma once

#include <filesystem>
#include <string>

namespace nsa::io {

// `p` absolute and normalised, symbolic links resolved where the path exists, without a trailing
// separator ("runs/x/" is "runs/x").
std::filesystem::path normal_path(const std::string& p);

// Whether `p` is `folder` or lies inside it (both normal_path's).
bool lies_within(const std::filesystem::path& p, const std::filesystem::path& folder);

// Creates the output folder `dir` (and its parents) unless it exists, refusing an empty name or a
// path that is not a folder; the errors name the command's `flag` ("--out") and say what it should
// be (`what`: "a run folder", "a folder for the shards"). Returns whether this call created it, so
// that its command can remove it again on failure – each by its own rule: `prepare` removes the
// whole folder (everything in it is that call's, and partial shards are of no use), `train` only
// a folder that holds nothing but its lock (a failed run's metrics and checkpoints are kept:
// RunFolderLock::release).
bool make_out_folder(const std::string& dir, const std::string& flag, const std::string& what);

}  // namespace nsa::io
