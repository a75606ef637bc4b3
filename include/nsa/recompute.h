// What the GPU model keeps of a layer's activations for its backward, and what it recomputes
// (docs/training.md, "Activation memory"). Every policy gives the same bits: a recomputed tensor
// comes from the same kernels on the same inputs as the forward's.
#pragma once

#include <string>

#include "nsa/error.h"

namespace nsa {

enum class Recompute {
  kNone,    // keep every activation the backward reads (fastest, most memory)
  kOps,     // keep the attention's state, recompute the cheap rest per op: the norms' outputs,
            // the attention's residual sum and the MLP's up-projections (a few % slower)
  kLayers,  // keep each layer's input only; the backward runs the layer's forward again
};

inline const char* recompute_name(Recompute r) {
  return r == Recompute::kNone ? "none" : r == Recompute::kOps ? "ops" : "layers";
}

// `flag` names the option in the error. A bare `--recompute` (empty value) means "layers".
inline Recompute parse_recompute(const std::string& s, const char* flag = "--recompute") {
  if (s == "none") return Recompute::kNone;
  if (s == "ops") return Recompute::kOps;
  if (s == "layers" || s.empty()) return Recompute::kLayers;
  throw Error(std::string(flag) + " '" + s + "': use none, ops or layers");
}

}  // namespace nsa
