/* The C ABI of NSA attention: what the Python package (python/nsa/, ctypes) and any other language
 * binds to, independent of a PyTorch or compiler version.
 *
 * Tensors cross the boundary as NsaTensorRef: a pointer to a contiguous row-major buffer and its
 * shape, so the library checks every shape against the config (nsa::Error naming the tensor)
 * before it touches memory. The caller allocates every output; the forward writes what the
 * backward needs (NsaAttnSaved), so no state lives in the library between calls. Each entry point
 * returns NSA_OK or an error code and writes nsa::Error's text into `err`.
 *
 * Only the CPU reference is implemented. A CUDA entry point will take the same structs with device
 * pointers plus a stream (`nsa_attention_forward_cuda(..., void* stream, ...)`) and bf16 inputs;
 * the structs carry nothing host-specific so that it needs no new types. */
#ifndef NSA_CAPI_H
#define NSA_CAPI_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define NSA_CAPI_VERSION 1

/* The library is built with hidden visibility; only these entry points are exported. */
#define NSA_CAPI __attribute__((visibility("default")))

enum NsaDtype { NSA_F32 = 0, NSA_F64 = 1 };
enum NsaStatus { NSA_OK = 0, NSA_ERR_INVALID = 1, NSA_ERR_INTERNAL = 2 };

/* data == NULL: the tensor is absent (an unused K/V with kv = shared, φ = avg parameters). */
typedef struct NsaTensorRef {
  void* data;
  int64_t ndim;
  int64_t shape[4];
} NsaTensorRef;

/* NsaConfig of include/nsa/config.h; phi: 0 avg, 1 mlp; kv: 0 separate, 1 shared; gate values
 * arrive already activated, so the gate activation is not part of it. */
typedef struct NsaAttnConfig {
  int64_t heads, groups, dk, dv;
  int64_t l, d, l_sel, n_sel, w;
  int64_t phi_hidden; /* 0: dk */
  double scale;       /* 0: 1/sqrt(dk) */
  int32_t phi;
  int32_t kv;
} NsaAttnConfig;

/* The inputs of one call, or (same shapes) their gradients. Branch order cmp, sel, win; with
 * kv = shared only k[0], v[0]. φ parameters in the order pos, w1, b1, w2, b2. Floating tensors
 * all have the call's dtype. */
typedef struct NsaAttnTensors {
  NsaTensorRef q;    /* [T, H, dk] */
  NsaTensorRef k[3]; /* [T, G, dk] */
  NsaTensorRef v[3]; /* [T, G, dv] */
  NsaTensorRef g[3]; /* [T, H] gate values */
  NsaTensorRef phi_k[5];
  NsaTensorRef phi_v[5];
} NsaAttnTensors;

/* The forward's outputs, which are also what the backward reads. */
typedef struct NsaAttnSaved {
  NsaTensorRef o;           /* [T, H, dv] */
  NsaTensorRef o_branch[3]; /* [T, H, dv] */
  NsaTensorRef lse[3];      /* [T, H] */
  NsaTensorRef k_cmp;       /* [C, G, dk], C = nsa_compressed_tokens */
  NsaTensorRef v_cmp;       /* [C, G, dv] */
  NsaTensorRef sel_idx;     /* [T, G, n_sel], int32 */
} NsaAttnSaved;

NSA_CAPI int32_t nsa_capi_version(void);

/* The compressed-token count C over all sequences of cu_seqlens [num_seqs + 1]. */
NSA_CAPI int32_t nsa_compressed_tokens(const NsaAttnConfig* cfg, const int64_t* cu_seqlens,
                                       int64_t num_seqs, int64_t* out, char* err, size_t err_size);

/* Forward on the CPU reference: fills every tensor of `out`. */
NSA_CAPI int32_t nsa_attention_forward_cpu(const NsaAttnConfig* cfg, int32_t dtype,
                                           const int64_t* cu_seqlens, int64_t num_seqs,
                                           const NsaAttnTensors* in, const NsaAttnSaved* out,
                                           char* err, size_t err_size);

/* Backward on the CPU reference: d_o [T, H, dv] → the gradient of every present input, written
 * into the present tensors of `grads` (overwritten, not accumulated). Uses the saved selection. */
NSA_CAPI int32_t nsa_attention_backward_cpu(const NsaAttnConfig* cfg, int32_t dtype,
                                            const int64_t* cu_seqlens, int64_t num_seqs,
                                            const NsaAttnTensors* in, const NsaAttnSaved* saved,
                                            const NsaTensorRef* d_o, const NsaAttnTensors* grads,
                                            char* err, size_t err_size);

#ifdef __cplusplus
}
#endif

#endif /* NSA_CAPI_H */
