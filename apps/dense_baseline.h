// The PyTorch SDPA baseline of `nsa bench decode --device cuda` (docs/inference.md, "The dense
// baseline"): bench/dense_decode.py run as a child process in the same call, its JSON lines
// parsed, and per (context, batch) the faster of our dense decode attention and SDPA's best
// backend chosen for the table's dense column, naming which. Finding and running a baseline
// script is shared with the training benchmark's (dense_train_baseline.h). Host-only (tested on
// the CPU).
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

namespace nsa::app {

// The fastest SDPA run of one (context, batch): ms per step (all layers' calls).
struct SdpaResult {
  double ms = 0;
  std::string backend, layout;  // "cudnn" / "flash" / ...; "packed" / "gqa"
  bool graph = true;            // timed as CUDA graph replays (false: eager calls)
};

struct SdpaBaseline {
  std::map<std::pair<int64_t, int64_t>, SdpaResult> best;  // (context, batch) → fastest
  std::vector<std::string> records;  // every JSON line the script printed, for --json
  std::string note;                  // why a result is missing (empty when all ran)
};

// The best results in the script's output ("dense_decode_best" lines; other lines are kept in
// records, anything that is not JSON is ignored).
SdpaBaseline parse_dense_decode(const std::string& output);

// A benchmark's baseline script: `path` unless it is "auto"; for "auto", bench/<name> under the
// working directory, else under the parent of `exe_dir` (the binary in build/), else "" (none).
std::string find_bench_script(const std::string& path, const std::string& exe_dir,
                              const std::string& name);
// The folder of this process's binary ("" when /proc/self/exe cannot be read).
std::string exe_dir();

// The script a benchmark's baseline option names (`option`: a path, "auto" or "off"; found as
// find_bench_script does), or "" with *note saying why the baseline is not measured: "off", or
// bench/<name> not found. `what` names the baseline in the note ("SDPA"), `flag` the option.
std::string baseline_script(const std::string& option, const std::string& exe_dir,
                            const std::string& name, const std::string& what,
                            const std::string& flag, std::string* note);

// The JSON objects a baseline script printed, one per line, each with its line (other lines –
// warnings, tracebacks, broken JSON – are skipped).
std::vector<std::pair<std::string, nlohmann::json>> json_lines(const std::string& output);

// `s` as one shell word (single-quoted), and a list as "1,2,3" – for baseline command lines.
std::string shell_quote(const std::string& s);
std::string comma_list(const std::vector<int64_t>& v);

// A command's output (stderr joined to stdout), exit status (-1: it could not start) and last
// non-empty line (a Python traceback ends with the error). Never throws.
struct ScriptRun {
  std::string command, output, last_line;
  int status = 0;
  // "'command' exited with status N: last line" – the note of a run whose results are missing.
  std::string summary() const;
};
ScriptRun run_script(const std::string& command);

struct SdpaShape {
  int64_t heads = 12, groups = 2, head_dim = 64, layers = 12, steps = 50, warmup = 5;
  // A cache per layer (--distinct-layers), else one layer's called `layers` times.
  bool distinct_layers = false;
};

// The command line that runs `script` with `interpreter` (e.g. python3) for these contexts,
// batches and shape (arguments quoted for the shell).
std::string dense_decode_command(const std::string& interpreter, const std::string& script,
                                 const std::vector<int64_t>& contexts,
                                 const std::vector<int64_t>& batches, const SdpaShape& shape);

// Runs the command (stderr joined to stdout) and parses what it printed. Never throws for a
// failed run: the note then says what happened (exit status, the last line printed).
SdpaBaseline run_dense_decode(const std::string& command);

// The table's dense column: the faster of ours and SDPA's best (nullptr: ours alone).
struct DenseChoice {
  double ms = 0;
  std::string by;  // "ours", or the SDPA backend ("cudnn", "flash", ...)
};
DenseChoice faster_dense(double ours_ms, const SdpaResult* sdpa);

}  // namespace nsa::app
