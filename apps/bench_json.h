// The --json file of a benchmark (`nsa bench attention | decode | train`): opened before anything
// runs, so that a path that cannot be written stops the command at once instead of after minutes
// of measuring, or silently.
#pragma once

#include <fstream>
#include <memory>
#include <string>

namespace nsa::app {

// The file at `path`, truncated, for JSON lines; null when `path` is empty. Throws nsa::Error
// naming the path when it cannot be opened for writing.
std::unique_ptr<std::ofstream> open_json_lines(const std::string& path);

}  // namespace nsa::app
