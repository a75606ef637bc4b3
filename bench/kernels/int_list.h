// "1,74,148" → {1, 74, 148}: the list options of the kernel bench programs (nsa_decode_tile's
// --keys, nsa_decode_loads' --ctas); each program checks the values' range itself.
#pragma once

#include <cstdlib>
#include <string>
#include <vector>

inline std::vector<int> parse_int_list(const std::string& s) {
  std::vector<int> out;
  size_t at = 0;
  while (at <= s.size()) {
    const size_t comma = s.find(',', at);
    out.push_back(std::atoi(s.substr(at, comma - at).c_str()));
    if (comma == std::string::npos) break;
    at = comma + 1;
  }
  return out;
}
