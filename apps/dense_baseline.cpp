// The SDPA baseline of the decode benchmark: find, run and parse bench/dense_decode.py, and pick
// the faster dense attention; finding and running any baseline script (see dense_baseline.h).
#include "dense_baseline.h"

#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <sstream>

namespace nsa::app {

std::string shell_quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

std::string comma_list(const std::vector<int64_t>& v) {
  std::string out;
  for (size_t i = 0; i < v.size(); ++i) out += (i ? "," : "") + std::to_string(v[i]);
  return out;
}

std::vector<std::pair<std::string, nlohmann::json>> json_lines(const std::string& output) {
  std::vector<std::pair<std::string, nlohmann::json>> out;
  std::istringstream in(output);
  for (std::string line; std::getline(in, line);) {
    if (line.empty() || line[0] != '{') continue;
    nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.is_object()) continue;
    out.emplace_back(line, std::move(j));
  }
  return out;
}

SdpaBaseline parse_dense_decode(const std::string& output) {
  SdpaBaseline out;
  std::string last_error;
  for (const auto& [line, j] : json_lines(output)) {
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

std::string find_bench_script(const std::string& path, const std::string& exe_dir,
                              const std::string& name) {
  namespace fs = std::filesystem;
  if (path != "auto") return path;
  const fs::path rel = fs::path("bench") / name;
  std::error_code ec;
  if (fs::exists(rel, ec)) return rel.string();
  if (!exe_dir.empty()) {
    const fs::path beside = fs::path(exe_dir).parent_path() / rel;
    if (fs::exists(beside, ec)) return beside.string();
  }
  return "";
}

std::string baseline_script(const std::string& option, const std::string& exe_dir,
                            const std::string& name, const std::string& what,
                            const std::string& flag, std::string* note) {
  if (option == "off") {
    *note = what + " not measured (" + flag + " off)";
    return "";
  }
  const std::string script = find_bench_script(option, exe_dir, name);
  if (script.empty()) {
    *note = what + " not measured: bench/" + name +
            " not found (run from the source tree or pass " + flag + ")";
  }
  return script;
}

std::string exe_dir() {
  std::error_code ec;
  const std::filesystem::path exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec ? "" : exe.parent_path().string();
}

ScriptRun run_script(const std::string& command) {
  ScriptRun run;
  run.command = command;
  FILE* pipe = popen((command + " 2>&1").c_str(), "r");
  if (!pipe) {
    run.status = -1;
    run.last_line = "could not start it";
    return run;
  }
  char buf[4096];
  size_t n = 0;
  while ((n = std::fread(buf, 1, sizeof(buf), pipe)) > 0) run.output.append(buf, n);
  const int status = pclose(pipe);
  run.status = status == -1 ? -1 : WIFEXITED(status) ? WEXITSTATUS(status) : 128;
  std::istringstream in(run.output);
  for (std::string line; std::getline(in, line);) {
    if (!line.empty()) run.last_line = line;
  }
  return run;
}

std::string ScriptRun::summary() const {
  return "'" + command + "' exited with status " + std::to_string(status) +
         (last_line.empty() ? "" : ": " + last_line.substr(0, 300));
}

std::string dense_decode_command(const std::string& interpreter, const std::string& script,
                                 const std::vector<int64_t>& contexts,
                                 const std::vector<int64_t>& batches, const SdpaShape& s) {
  std::ostringstream cmd;
  cmd << interpreter << " " << shell_quote(script) << " --contexts " << comma_list(contexts)
      << " --batches " << comma_list(batches) << " --heads " << s.heads << " --groups " << s.groups
      << " --head-dim " << s.head_dim << " --layers " << s.layers << " --steps " << s.steps
      << " --warmup " << s.warmup << (s.distinct_layers ? " --distinct-layers" : "");
  return cmd.str();
}

SdpaBaseline run_dense_decode(const std::string& command) {
  const ScriptRun run = run_script(command);
  SdpaBaseline out = parse_dense_decode(run.output);
  if (run.status != 0 || out.best.empty()) out.note = run.summary();
  return out;
}

DenseChoice faster_dense(double ours_ms, const SdpaResult* sdpa) {
  if (sdpa && sdpa->ms > 0 && sdpa->ms < ours_ms) return {sdpa->ms, sdpa->backend};
  return {ours_ms, "ours"};
}

}  // namespace nsa::app
