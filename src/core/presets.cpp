// The attention shapes of the shipped model configs (configs/*.yaml).
#include "nsa/presets.h"

#include "nsa/error.h"

namespace nsa {
namespace {

struct Preset {
  const char* name;
  int64_t heads, groups, dk, dv, l, d, l_sel, n_sel, w;
};
constexpr Preset kPresets[] = {
    {"tiny", 4, 2, 16, 16, 16, 8, 32, 4, 64},
    {"small", 8, 2, 32, 32, 16, 8, 32, 8, 256},
    {"m7c_125m", 12, 2, 64, 64, 32, 16, 64, 16, 512},
    {"paper_attn", 64, 4, 192, 128, 32, 16, 64, 16, 512},
};

}  // namespace

NsaConfig attention_preset(const std::string& name) {
  for (const Preset& p : kPresets) {
    if (name != p.name) continue;
    NsaConfig cfg;
    cfg.heads = p.heads;
    cfg.groups = p.groups;
    cfg.dk = p.dk;
    cfg.dv = p.dv;
    cfg.l = p.l;
    cfg.d = p.d;
    cfg.l_sel = p.l_sel;
    cfg.n_sel = p.n_sel;
    cfg.w = p.w;
    return cfg;
  }
  std::string names;
  for (const Preset& p : kPresets) names += std::string(names.empty() ? "" : ", ") + p.name;
  throw Error(str("unknown config '", name, "'; available: ", names));
}

std::vector<std::string> attention_preset_names() {
  std::vector<std::string> out;
  for (const Preset& p : kPresets) out.push_back(p.name);
  return out;
}

}  // namespace nsa
