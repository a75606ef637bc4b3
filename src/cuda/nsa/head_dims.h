// The (dk, dv) head dimensions the tensor-core kernels are instantiated for, and the dispatch from
// runtime sizes to the compile-time ones (fragment arrays live in registers, so dims are template
// parameters). Adding a pair here instantiates every kernel for it.
#pragma once

#include <cstdint>
#include <type_traits>

#include "nsa/error.h"

namespace nsa::cuda {

template <int N>
using Dim = std::integral_constant<int, N>;

inline bool head_dims_supported(int64_t dk, int64_t dv) {
  return (dk == 16 && dv == 16) || (dk == 32 && (dv == 16 || dv == 32)) || (dk == 64 && dv == 64) ||
         (dk == 128 && dv == 128) || (dk == 192 && dv == 128);
}

inline const char* supported_head_dims() {
  return "(16,16) (32,16) (32,32) (64,64) (128,128) (192,128)";
}

// Calls f(Dim<dk>{}, Dim<dv>{}).
template <typename F>
void dispatch_head_dims(int64_t dk, int64_t dv, F&& f) {
  if (dk == 16 && dv == 16) return f(Dim<16>{}, Dim<16>{});
  if (dk == 32 && dv == 16) return f(Dim<32>{}, Dim<16>{});
  if (dk == 32 && dv == 32) return f(Dim<32>{}, Dim<32>{});
  if (dk == 64 && dv == 64) return f(Dim<64>{}, Dim<64>{});
  if (dk == 128 && dv == 128) return f(Dim<128>{}, Dim<128>{});
  if (dk == 192 && dv == 128) return f(Dim<192>{}, Dim<128>{});
  NSA_CHECK(false, "CUDA kernels: head dims (dk, dv) = (", dk, ", ", dv,
            ") are not built; supported: ", supported_head_dims());
}

}  // namespace nsa::cuda
