// Attention hyper-parameter flags (see config_flags.h).
#include "config_flags.h"

#include <algorithm>

namespace nsa::app {

void add_config_flags(CLI::App* cmd, ConfigFlags& flags, const std::vector<std::string>& fields) {
  for (const std::string& field : fields) {
    std::string flag = "--" + field;
    std::replace(flag.begin(), flag.end(), '_', '-');
    cmd->add_option_function<std::string>(
           flag, [&flags, field](const std::string& v) { flags.values[field] = v; },
           "override the attention config field '" + field + "'")
        ->type_name("VALUE");
  }
}

NsaConfig apply_config_flags(NsaConfig base, const ConfigFlags& flags) {
  for (const auto& [field, value] : flags.values) set_config_field(base, field, value);
  base.validate();
  return base;
}

}  // namespace nsa::app
