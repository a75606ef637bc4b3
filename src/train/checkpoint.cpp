// Atomic checkpoints and exact resume (see checkpoint.h).
#include "checkpoint.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "checkpoint_state.h"
#include "io/durable_file.h"
#include "io/safetensors.h"
#include "nsa/error.h"

namespace nsa {
namespace fs = std::filesystem;
namespace {

std::vector<fs::path> complete_checkpoints(const std::string& out_dir) {
  std::vector<fs::path> out;
  if (!fs::is_directory(out_dir)) return out;
  for (const auto& e : fs::directory_iterator(out_dir)) {
    const std::string name = e.path().filename().string();
    if (e.is_directory() && name.rfind("ckpt_", 0) == 0 && name.find('.') == std::string::npos &&
        fs::exists(e.path() / "COMPLETE")) {
      out.push_back(e.path());
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

void load_into(const io::SafetensorsFile& f, const std::string& name, Tensor<float>& dst) {
  NSA_CHECK(f.has(name), "checkpoint file '", f.path(), "' has no tensor '", name, "'");
  Tensor<float> t = f.get_float(name);
  NSA_CHECK(t.shape == dst.shape, "checkpoint tensor '", name, "' in '", f.path(), "' has shape ",
            shape_str(t.shape), ", the model expects ", shape_str(dst.shape));
  const bool moment2 = name.rfind("v.", 0) == 0;  // second moments are squares: never negative
  for (int64_t i = 0; i < t.numel(); ++i) {
    NSA_CHECK(std::isfinite(t[i]) && !(moment2 && t[i] < 0), "checkpoint tensor '", name, "' in '",
              f.path(), "' holds ", t[i], " at index ", i,
              moment2 ? ": second moments must be finite and >= 0" : ": weights must be finite",
              " (a damaged checkpoint, or a run that diverged)");
  }
  dst = std::move(t);
}

// What a checkpoint just written must pass before older ones are pruned: its state reads back
// with the step it was written for, and both tensor files are whole (headers against sizes).
void verify_checkpoint(const std::string& dir, int64_t step) {
  const TrainState s = read_checkpoint_state(dir);
  NSA_CHECK(s.step == step, "checkpoint '", dir, "' reads back step ", s.step, ", written as ",
            step);
  for (const char* file : {"model.safetensors", "optimizer.safetensors"}) {
    io::SafetensorsFile::read_header((fs::path(dir) / file).string());
  }
}

}  // namespace

std::string save_checkpoint(const std::string& out_dir, const TrainState& state,
                            const NamedTensors& params, std::vector<Tensor<float>>& adam_m,
                            std::vector<Tensor<float>>& adam_v, int keep) {
  char name[32];
  std::snprintf(name, sizeof name, "ckpt_%08lld", static_cast<long long>(state.step));
  const fs::path final_dir = fs::path(out_dir) / name;
  const fs::path tmp = fs::path(out_dir) / (std::string(name) + ".tmp");
  fs::remove_all(tmp);
  fs::create_directories(tmp);
  io::SafetensorsFile model, opt;
  for (size_t i = 0; i < params.size(); ++i) {
    model.put(params[i].first, *params[i].second);
    opt.put("m." + params[i].first, adam_m[i]);
    opt.put("v." + params[i].first, adam_v[i]);
  }
  model.metadata = {{"format", "pt"}};
  const nlohmann::json j = {{"format", 1},
                            {"step", state.step},
                            {"train_position", state.train_position},
                            {"model_config", state.model_config}};
  try {  // every file durable before COMPLETE, COMPLETE durable before the rename
    model.write((tmp / "model.safetensors").string());
    opt.write((tmp / "optimizer.safetensors").string());
    io::write_file_durably((tmp / "state.json").string(), j.dump(2) + "\n");
    io::sync_directory(tmp.string());
    io::write_file_durably((tmp / "COMPLETE").string(), "ok\n");
    io::sync_directory(tmp.string());
  } catch (...) {
    std::error_code ignored;
    fs::remove_all(tmp, ignored);  // the previous checkpoints stay as they are
    throw;
  }
  fs::remove_all(final_dir);
  fs::rename(tmp, final_dir);
  io::sync_directory(out_dir);
  verify_checkpoint(final_dir.string(), state.step);  // only a verified checkpoint prunes others
  const auto all = complete_checkpoints(out_dir);
  for (size_t i = 0; keep > 0 && i + static_cast<size_t>(keep) < all.size(); ++i) {
    if (all[i] != final_dir) fs::remove_all(all[i]);
  }
  return final_dir.string();
}

std::string latest_checkpoint(const std::string& out_dir) {
  const auto all = complete_checkpoints(out_dir);
  return all.empty() ? "" : all.back().string();
}

std::string resolve_checkpoint(const std::string& checkpoint, const std::string& run) {
  if (!checkpoint.empty()) return checkpoint;
  NSA_CHECK(!run.empty(), "pass --checkpoint DIR or --run DIR");
  const std::string latest = latest_checkpoint(run);
  NSA_CHECK(!latest.empty(), "run '", run, "' has no complete checkpoint");
  return latest;
}

TrainState read_checkpoint_state(const std::string& dir) {
  NSA_CHECK(fs::exists(dir), "checkpoint '", dir, "' does not exist");
  NSA_CHECK(fs::is_directory(dir), "checkpoint '", dir, "' is not a folder (a ckpt_* folder)");
  NSA_CHECK(fs::exists(fs::path(dir) / "COMPLETE") || complete_checkpoints(dir).empty(), "'", dir,
            "' is a run folder, not a checkpoint: pass --run '", dir,
            "' (its newest complete checkpoint) or one of its ckpt_* folders");
  NSA_CHECK(fs::exists(fs::path(dir) / "COMPLETE"), "checkpoint '", dir,
            "' is incomplete (no COMPLETE marker): it was interrupted while being written");
  const fs::path path = fs::path(dir) / "state.json";
  std::ifstream f(path);
  NSA_CHECK(f && fs::is_regular_file(path), "checkpoint '", dir, "' has no state.json");
  const std::string text(std::istreambuf_iterator<char>(f), {});
  return parse_train_state(path.string(), text);
}

void load_model_weights(const std::string& dir, const NamedTensors& params) {
  const auto model = io::SafetensorsFile::read((fs::path(dir) / "model.safetensors").string());
  for (const auto& [name, tensor] : params) load_into(model, name, *tensor);
}

TrainState load_checkpoint(const std::string& dir, const NamedTensors& params,
                           std::vector<Tensor<float>>& adam_m, std::vector<Tensor<float>>& adam_v) {
  const TrainState s = read_checkpoint_state(dir);
  load_model_weights(dir, params);
  const auto opt = io::SafetensorsFile::read((fs::path(dir) / "optimizer.safetensors").string());
  for (size_t i = 0; i < params.size(); ++i) {
    load_into(opt, "m." + params[i].first, adam_m[i]);
    load_into(opt, "v." + params[i].first, adam_v[i]);
  }
  return s;
}

}  // namespace nsa
