// The kernel bench programs' options: each a flag followed by an int or a comma-separated int list
// ("1,74,148" → {1, 74, 148}); one parser for nsa_decode_tile, nsa_decode_loads and
// nsa_decode_select, each program checking the values' range itself.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <initializer_list>
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

struct IntOption {
  const char* flag;
  int* value;
};
struct IntListOption {
  const char* flag;
  std::vector<int>* values;
};

// Sets the options of argv[1 ..]; an unknown flag, or one without its value, prints it and the
// usage line ("usage: <program> <usage>") and returns false.
inline bool parse_options(int argc, char** argv, const char* program, const char* usage,
                          std::initializer_list<IntOption> ints,
                          std::initializer_list<IntListOption> lists = {}) {
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    bool known = false;
    if (i + 1 < argc) {
      for (const IntOption& o : ints) {
        if (!known && arg == o.flag) *o.value = std::atoi(argv[++i]), known = true;
      }
      for (const IntListOption& o : lists) {
        if (!known && arg == o.flag) *o.values = parse_int_list(argv[++i]), known = true;
      }
    }
    if (!known) {
      std::fprintf(stderr, "%s: unknown or incomplete option '%s'\nusage: %s %s\n", program,
                   arg.c_str(), program, usage);
      return false;
    }
  }
  return true;
}
