// `nsa inspect FILE`: what a safetensors file holds – metadata, and per tensor its dtype, shape
// and (for floating tensors) min / max / mean / non-finite count. For checking interop outputs and,
// later, checkpoints without Python.
#include <cmath>
#include <cstdio>
#include <memory>

#include "commands.h"
#include "io/safetensors.h"

namespace nsa::app {

void register_inspect_command(CLI::App& app) {
  auto path = std::make_shared<std::string>();
  CLI::App* cmd = app.add_subcommand("inspect", "Describe the tensors of a safetensors file");
  cmd->add_option("file", *path, "safetensors file")->required();
  cmd->callback([path] {
    const io::SafetensorsFile f = io::SafetensorsFile::read(*path);
    std::printf("%s\n", path->c_str());
    for (const auto& [key, value] : f.metadata) {
      std::printf("  meta %-12s %s\n", key.c_str(), value.c_str());
    }
    for (const std::string& name : f.names()) {
      const io::StoredTensor& t = f.at(name);
      std::printf("  %-14s %-5s %-20s", name.c_str(), io::dtype_name(t.dtype),
                  shape_str(t.shape).c_str());
      if (t.dtype == io::DType::kI32 || t.dtype == io::DType::kI64) {
        const std::vector<int64_t> v = f.get_int(name);
        int64_t lo = v.empty() ? 0 : v[0], hi = lo;
        for (int64_t x : v) lo = std::min(lo, x), hi = std::max(hi, x);
        std::printf(" min %lld max %lld\n", static_cast<long long>(lo), static_cast<long long>(hi));
      } else if (t.dtype != io::DType::kU8) {
        const Tensor<float> v = f.get_float(name);
        double lo = INFINITY, hi = -INFINITY, sum = 0;
        int64_t bad = 0;
        for (float x : v.data) {
          if (!std::isfinite(x)) {
            ++bad;
            continue;
          }
          lo = std::min<double>(lo, x), hi = std::max<double>(hi, x), sum += x;
        }
        std::printf(" min %+.4e max %+.4e mean %+.4e%s\n", lo, hi,
                    v.numel() ? sum / static_cast<double>(v.numel()) : 0.0,
                    bad ? str("  NON-FINITE: ", bad).c_str() : "");
      } else {
        std::printf("\n");
      }
    }
  });
}

}  // namespace nsa::app
