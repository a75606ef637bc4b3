// The attention shapes of the shipped model configs (configs/*.yaml), by name, for the CLI and
// benches.
#pragma once

#include <string>
#include <vector>

#include "nsa/config.h"

namespace nsa {

// "tiny", "small", "m7c_125m", "paper_attn"; throws nsa::Error listing the names otherwise.
NsaConfig attention_preset(const std::string& name);
std::vector<std::string> attention_preset_names();

}  // namespace nsa
