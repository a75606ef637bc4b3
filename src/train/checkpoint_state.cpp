// Validation of a checkpoint's state.json (see checkpoint_state.h).
#include "checkpoint_state.h"

#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "nsa/error.h"
#include "nsa/model_config.h"

namespace nsa {
namespace {

int64_t integer_field(const nlohmann::json& j, const char* key, int64_t lo, int64_t hi,
                      const std::string& where) {
  NSA_CHECK(j.contains(key), where, ": field '", key, "' is missing");
  const nlohmann::json& v = j[key];
  NSA_CHECK(v.is_number_integer(), where, ": field '", key, "' = ", v.dump(),
            " must be an integer");
  NSA_CHECK(!v.is_number_unsigned() || v.get<uint64_t>() <= static_cast<uint64_t>(hi), where,
            ": field '", key, "' = ", v.dump(), " must be in [", lo, ", ", hi, "]");
  const int64_t x = v.get<int64_t>();
  NSA_CHECK(lo <= x && x <= hi, where, ": field '", key, "' = ", x, " must be in [", lo, ", ", hi,
            "]");
  return x;
}

}  // namespace

TrainState parse_train_state(const std::string& path, const std::string& text) {
  const std::string where = str("checkpoint state '", path, "'");
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  NSA_CHECK(!j.is_discarded(), where, " is not valid JSON (damaged or truncated)");
  NSA_CHECK(j.is_object(), where, " must be a JSON object");
  for (const auto& [key, value] : j.items()) {
    NSA_CHECK(key == "format" || key == "step" || key == "train_position" || key == "model_config",
              where, ": unknown field '", key, "' (format, step, train_position, model_config)");
  }
  integer_field(j, "format", 1, 1, where);
  TrainState s;
  s.step = integer_field(j, "step", 1, kMaxCheckpointStep, where);
  s.train_position = integer_field(j, "train_position", 0, int64_t{1} << 62, where);
  NSA_CHECK(j.contains("model_config") && j["model_config"].is_object(), where,
            ": field 'model_config' must be an object of field: \"value\" strings");
  ModelConfig cfg;
  for (const auto& [key, value] : j["model_config"].items()) {
    NSA_CHECK(value.is_string(), where, ": model_config field '", key, "' = ", value.dump(),
              " must be a string");
    try {
      set_model_field(cfg, key, value.get<std::string>());
    } catch (const Error& e) {
      throw Error(str(where, ": model_config: ", e.what()));
    }
    s.model_config[key] = value.get<std::string>();
  }
  // Checkpoints written before `attention` existed are NSA models: the one field that may be
  // missing, filled in so that every reader sees the complete config.
  if (!s.model_config.count("attention")) s.model_config["attention"] = cfg.attention;
  for (const auto& [key, value] : model_config_fields(cfg)) {
    NSA_CHECK(s.model_config.count(key), where, ": model_config lacks field '", key, "'");
  }
  try {
    cfg.validate();
  } catch (const Error& e) {
    throw Error(str(where, ": model_config: ", e.what()));
  }
  // The folder name is the step it holds: a mismatch is a hand-edited or misplaced file.
  const std::string folder = std::filesystem::path(path).parent_path().filename().string();
  char expected[32];
  std::snprintf(expected, sizeof expected, "ckpt_%08lld", static_cast<long long>(s.step));
  NSA_CHECK(folder.rfind("ckpt_", 0) != 0 || folder == expected, where, ": step ", s.step,
            " does not match its folder '", folder, "'");
  return s;
}

void check_resume_position(const TrainState& state, const TokenLoader& loader,
                           const std::string& checkpoint) {
  const int64_t limit = loader.synthetic() ? int64_t{1} << 40 : loader.num_tokens();
  NSA_CHECK(state.train_position <= limit, "checkpoint '", checkpoint, "': train_position ",
            state.train_position, " lies beyond the training data (",
            loader.synthetic() ? str(limit, " batches of generated data")
                               : str(limit, " tokens in the shards"),
            "): resume with the data the run was trained on");
}

}  // namespace nsa
