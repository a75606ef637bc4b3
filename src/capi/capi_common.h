// What the C ABI's CPU and CUDA entry points share (internal to libnsa_capi): the config from
// NsaAttnConfig, shapes of NsaTensorRef, and the guard that turns every exception into a status and
// a message.
#pragma once

#include <algorithm>
#include <cstring>
#include <exception>
#include <string>

#include "nsa/attention.h"
#include "nsa_capi.h"

namespace nsa::capi {

constexpr const char* kPhiNames[5] = {"pos", "w1", "b1", "w2", "b2"};

inline Shape ref_shape(const NsaTensorRef& r, const std::string& name) {
  NSA_CHECK(r.ndim >= 0 && r.ndim <= 4, "tensor '", name, "' has ", r.ndim,
            " dimensions; the C ABI carries at most 4");
  return Shape(r.shape, r.shape + r.ndim);
}

// "k" with shared K/V, "k_sel" with separate ones: the name the caller knows the tensor by.
inline std::string branch_name(const char* kind, int c, const NsaConfig& cfg) {
  return cfg.kv == KvMode::kShared ? std::string(kind) : std::string(kind) + "_" + kBranchNames[c];
}

inline NsaConfig make_config(const NsaAttnConfig* c) {
  NSA_CHECK(c, "config is NULL");
  NSA_CHECK(c->phi == 0 || c->phi == 1, "phi = ", c->phi, " must be 0 (avg) or 1 (mlp)");
  NSA_CHECK(c->kv == 0 || c->kv == 1, "kv = ", c->kv, " must be 0 (separate) or 1 (shared)");
  NsaConfig cfg;
  cfg.heads = c->heads;
  cfg.groups = c->groups;
  cfg.dk = c->dk;
  cfg.dv = c->dv;
  cfg.l = c->l;
  cfg.d = c->d;
  cfg.l_sel = c->l_sel;
  cfg.n_sel = c->n_sel;
  cfg.w = c->w;
  cfg.phi_hidden = c->phi_hidden;
  cfg.scale = c->scale;
  cfg.phi = c->phi == 1 ? Phi::kMlp : Phi::kAvg;
  cfg.kv = c->kv == 1 ? KvMode::kShared : KvMode::kSeparate;
  cfg.validate();
  return cfg;
}

inline int64_t tokens_of(const NsaAttnTensors* in) {
  NSA_CHECK(in && in->q.data && in->q.ndim >= 1, "tensor 'q' is missing");
  return in->q.shape[0];
}

// Runs fn, turning every exception into a status and its message.
template <typename Fn>
int32_t guarded(char* err, size_t err_size, Fn&& fn) {
  std::string message;
  int32_t status = NSA_OK;
  try {
    fn();
  } catch (const Error& e) {
    message = e.what();
    status = NSA_ERR_INVALID;
  } catch (const std::exception& e) {
    message = std::string("internal error: ") + e.what();
    status = NSA_ERR_INTERNAL;
  } catch (...) {
    message = "internal error: unknown exception";
    status = NSA_ERR_INTERNAL;
  }
  if (status != NSA_OK && err && err_size > 0) {
    const size_t n = std::min(message.size(), err_size - 1);
    std::memcpy(err, message.data(), n);
    err[n] = '\0';
  }
  return status;
}

// Writes an NSA_ERR_UNAVAILABLE message (the CUDA entry points of a build without CUDA).
inline int32_t unavailable(const char* message, char* err, size_t err_size) {
  if (err && err_size > 0) {
    const size_t n = std::min(std::strlen(message), err_size - 1);
    std::memcpy(err, message, n);
    err[n] = '\0';
  }
  return NSA_ERR_UNAVAILABLE;
}

}  // namespace nsa::capi
