// Errors for bad input and broken invariants.
//
// Every user-facing failure (a config field out of range, a tensor with the wrong shape, a corrupt
// file) is an nsa::Error whose message names the field, tensor or file and what is allowed. The
// CLI prints the message on one line and exits non-zero; tests match on it.
#pragma once

#include <cmath>
#include <sstream>
#include <stdexcept>
#include <string>

namespace nsa {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

namespace detail {
inline void append(std::ostringstream&) {}
template <typename First, typename... Rest>
void append(std::ostringstream& os, const First& first, const Rest&... rest) {
  os << first;
  append(os, rest...);
}
}  // namespace detail

// Builds a message from any streamable pieces: nsa::str("l = ", l, " is not a multiple of d").
template <typename... Args>
std::string str(const Args&... args) {
  std::ostringstream os;
  detail::append(os, args...);
  return os.str();
}

}  // namespace nsa

// Throws nsa::Error with the streamed message when `cond` is false.
#define NSA_CHECK(cond, ...)                                  \
  do {                                                        \
    if (!(cond)) throw ::nsa::Error(::nsa::str(__VA_ARGS__)); \
  } while (0)

namespace nsa {

// A flag or field that takes a finite number >= 0 (rates, limits, seconds, a temperature): "--lr =
// -1 must be a finite number >= 0", `note` appended (" (0: never stop)"); NaN and ±inf fail too.
// One check, so that every such flag says it the same way.
inline void check_finite_non_negative(const char* name, double v, const char* note = "") {
  NSA_CHECK(std::isfinite(v) && v >= 0, name, " = ", v, " must be a finite number >= 0", note);
}

}  // namespace nsa
