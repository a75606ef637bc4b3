// The SDPA baseline of the decode benchmark: find, run and parse bench/dense_decode.py, and pick
// the faster dense attention (see dense_baseline.h).
#include "dense_baseline.h"

#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <sstream>

namespace nsa::app {
namespace {

std::string shell_quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

std::string joined(const std::vector<int64_t>& v) {
  std::string out;
  for (size_t i = 0; i < v.size(); ++i) out += (i ? "," : "") + std::to_string(v[i]);
  return out;
}

}  // namespace

SdpaBaseline parse_dense_decode(const std::string& output) {
  SdpaBaseline out;
  std::istringstream in(output);
  std::string line, last_error;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] != '{') continue;
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.is_object()) continue;
    out.records.push_back(line);
    if (j.value("bench", "") != "dense_decode_best") continue;
    if (!j.contains("ms") || !j.contains("S") || !j.contains("B")) {
      last_error = j.value("error", std::string("no result"));
      continue;
    }
    SdpaResult r;
    r.ms = j["ms"].get<double>();
    r.backend = j.value("backend", "");
    r.layout = j.value("layout", "");
    r.graph = j.value("graph", true);
    out.best[{j["S"].get<int64_t>(), j["B"].get<int64_t>()}] = r;
  }
  if (!last_error.empty()) out.note = "SDPA did not run some shapes: " + last_error;
  return out;
}

std::string find_dense_decode_script(const std::string& path, const std::string& exe_dir) {
  namespace fs = std::filesystem;
  if (path != "auto") return path;
  const fs::path rel = fs::path("bench") / "dense_decode.py";
  std::error_code ec;
  if (fs::exists(rel, ec)) return rel.string();
  if (!exe_dir.empty()) {
    const fs::path beside = fs::path(exe_dir).parent_path() / rel;
    if (fs::exists(beside, ec)) return beside.string();
  }
  return "";
}

std::string dense_decode_command(const std::string& interpreter, const std::string& script,
                                 const std::vector<int64_t>& contexts,
                                 const std::vector<int64_t>& batches, const SdpaShape& s) {
  std::ostringstream cmd;
  cmd << interpreter << " " << shell_quote(script) << " --contexts " << joined(contexts)
      << " --batches " << joined(batches) << " --heads " << s.heads << " --groups " << s.groups
      << " --head-dim " << s.head_dim << " --layers " << s.layers << " --steps " << s.steps
      << " --warmup " << s.warmup;
  return cmd.str();
}

SdpaBaseline run_dense_decode(const std::string& command) {
  std::string output;
  FILE* pipe = popen((command + " 2>&1").c_str(), "r");
  if (!pipe) {
    SdpaBaseline none;
    none.note = "could not start '" + command + "'";
    return none;
  }
  char buf[4096];
  size_t n = 0;
  while ((n = std::fread(buf, 1, sizeof(buf), pipe)) > 0) output.append(buf, n);
  const int status = pclose(pipe);
  SdpaBaseline out = parse_dense_decode(output);
  const int code = status == -1 ? -1 : WIFEXITED(status) ? WEXITSTATUS(status) : 128;
  if (code != 0 || out.best.empty()) {
    std::string last;  // the last non-empty line: a Python traceback ends with the error
    std::istringstream in(output);
    for (std::string line; std::getline(in, line);) {
      if (!line.empty()) last = line;
    }
    out.note = "'" + command + "' exited with status " + std::to_string(code) +
               (last.empty() ? "" : ": " + last.substr(0, 300));
  }
  return out;
}

DenseChoice faster_dense(double ours_ms, const SdpaResult* sdpa) {
  if (sdpa && sdpa->ms > 0 && sdpa->ms < ours_ms) return {sdpa->ms, sdpa->backend};
  return {ours_ms, "ours"};
}

}  // namespace nsa::app
