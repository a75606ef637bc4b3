// Command-line flags for the attention hyper-parameters, shared by the subcommands that take them.
//
// Each flag (--l, --n-sel, ...) only records its text; set_config_field() parses it, so flags,
// file metadata and config files go through one parser and give the same error messages.
#pragma once

#include <map>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "nsa/config.h"

namespace nsa::app {

struct ConfigFlags {
  std::map<std::string, std::string> values;  // field -> text, only the flags that were given
};

// Adds --<field> for each field (underscores become dashes: --l-sel).
void add_config_flags(CLI::App* cmd, ConfigFlags& flags, const std::vector<std::string>& fields);
// base with every given flag applied, then validated.
NsaConfig apply_config_flags(NsaConfig base, const ConfigFlags& flags);

}  // namespace nsa::app
