// `nsa inspect FILE`: what a safetensors file holds – metadata, and per tensor its dtype, shape
// and (for floating tensors) min / max / mean of the finite values and the non-finite count. For
// checking interop outputs and, later, checkpoints without Python.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>

#include "commands.h"
#include "io/safetensors.h"

namespace nsa::app {
namespace {

// A name or metadata value as one line: control characters escaped, and past 120 bytes cut (at a
// UTF-8 character's start) with its length said – a file's header is anyone's text.
std::string shown(const std::string& value) {
  constexpr size_t kMax = 120;
  size_t cut = std::min(value.size(), kMax);
  while (cut > 0 && cut < value.size() && (static_cast<unsigned char>(value[cut]) & 0xc0) == 0x80)
    --cut;
  std::string out;
  for (size_t i = 0; i < cut; ++i) {
    const unsigned char c = static_cast<unsigned char>(value[i]);
    if (c == '\n') {
      out += "\\n";
    } else if (c < 0x20 || c == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    } else {
      out += static_cast<char>(c);
    }
  }
  if (cut < value.size()) out += str("… (", value.size(), " bytes)");
  return out;
}

}  // namespace

void register_inspect_command(CLI::App& app) {
  auto path = std::make_shared<std::string>();
  CLI::App* cmd = app.add_subcommand("inspect", "Describe the tensors of a safetensors file");
  cmd->add_option("file", *path, "safetensors file")->required();
  cmd->callback([path] {
    const io::SafetensorsFile f = io::SafetensorsFile::read(*path);
    std::printf("%s\n", path->c_str());
    for (const auto& [key, value] : f.metadata) {
      std::printf("  meta %-12s %s\n", shown(key).c_str(), shown(value).c_str());
    }
    for (const std::string& name : f.names()) {
      const io::StoredTensor& t = f.at(name);
      std::printf("  %-14s %-5s %-20s", shown(name).c_str(), io::dtype_name(t.dtype),
                  shape_str(t.shape).c_str());
      if (t.dtype == io::DType::kU8) {
        std::printf("\n");
      } else if (t.dtype == io::DType::kI32 || t.dtype == io::DType::kI64) {
        const std::vector<int64_t> v = f.get_int(name);
        if (v.empty()) {
          std::printf(" empty\n");
          continue;
        }
        int64_t lo = v[0], hi = lo;
        for (int64_t x : v) lo = std::min(lo, x), hi = std::max(hi, x);
        std::printf(" min %lld max %lld\n", static_cast<long long>(lo), static_cast<long long>(hi));
      } else {
        // min / max / mean over the finite values; the others counted apart.
        const Tensor<float> v = f.get_float(name);
        double lo = INFINITY, hi = -INFINITY, sum = 0;
        int64_t finite = 0;
        for (float x : v.data) {
          if (!std::isfinite(x)) continue;
          lo = std::min<double>(lo, x), hi = std::max<double>(hi, x), sum += x, ++finite;
        }
        const int64_t bad = v.numel() - finite;
        if (v.numel() == 0) {
          std::printf(" empty\n");
        } else if (finite == 0) {
          std::printf(" no finite values  NON-FINITE: %lld\n", static_cast<long long>(bad));
        } else {
          std::printf(" min %+.4e max %+.4e mean %+.4e%s\n", lo, hi,
                      sum / static_cast<double>(finite),
                      bad ? str("  NON-FINITE: ", bad).c_str() : "");
        }
      }
    }
  });
}

}  // namespace nsa::app
