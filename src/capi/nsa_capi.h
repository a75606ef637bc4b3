/* The C ABI of NSA attention: what the Python package (python/nsa/, ctypes) and any other language
 * binds to, independent of a PyTorch or compiler version.
 *
 * Tensors cross the boundary as NsaTensorRef: a pointer to a contiguous row-major buffer and its
 * shape, so the library checks every shape against the config (nsa::Error naming the tensor)
 * before it touches memory. The caller allocates every output; the forward writes what the
 * backward needs (NsaAttnSaved), so no state lives in the library between calls. Each entry point
 * returns NSA_OK or an error code and writes nsa::Error's text into `err`.
 *
 * Two backends behind the same structs: the CPU reference (fp32 or fp64 host buffers) and, in a
 * build with CUDA, the Hopper kernels (device pointers, bf16 inputs, the caller's stream and
 * workspace; section "CUDA" below). A build without CUDA has the CUDA entry points too: they
 * return NSA_ERR_UNAVAILABLE. */
#ifndef NSA_CAPI_H
#define NSA_CAPI_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define NSA_CAPI_VERSION 3

/* The library is built with hidden visibility; only these entry points are exported. */
#define NSA_CAPI __attribute__((visibility("default")))

enum NsaDtype { NSA_F32 = 0, NSA_F64 = 1 };
/* NSA_ERR_UNAVAILABLE: the backend is not there (a build without CUDA, no GPU, not sm_90). */
enum NsaStatus { NSA_OK = 0, NSA_ERR_INVALID = 1, NSA_ERR_INTERNAL = 2, NSA_ERR_UNAVAILABLE = 3 };

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

/* Forward on the CPU reference with the selected blocks given instead of chosen: sel_idx
 * [T, G, n_sel] int32, ascending, -1 padded, containing the forced blocks (checked). For comparing
 * with another backend on identical selections (python/tests/test_cuda.py, as tests/cuda does). */
NSA_CAPI int32_t nsa_attention_forward_cpu_given_selection(
    const NsaAttnConfig* cfg, int32_t dtype, const int64_t* cu_seqlens, int64_t num_seqs,
    const NsaAttnTensors* in, const NsaTensorRef* sel_idx, const NsaAttnSaved* out, char* err,
    size_t err_size);

/* Backward on the CPU reference: d_o [T, H, dv] → the gradient of every present input, written
 * into the present tensors of `grads` (overwritten, not accumulated). Uses the saved selection. */
NSA_CAPI int32_t nsa_attention_backward_cpu(const NsaAttnConfig* cfg, int32_t dtype,
                                            const int64_t* cu_seqlens, int64_t num_seqs,
                                            const NsaAttnTensors* in, const NsaAttnSaved* saved,
                                            const NsaTensorRef* d_o, const NsaAttnTensors* grads,
                                            char* err, size_t err_size);

/* ---- CUDA (docs/cuda.md, docs/pytorch.md) -------------------------------------------------
 *
 * The same structs with device pointers (16-byte aligned, contiguous) of the current device:
 *   in:    q, k, v, g bf16; phi_k, phi_v fp32.
 *   out:   o and o_branch bf16; lse fp32; k_cmp [C, G, dk] and v_cmp [C, G, dv] fp32 with
 *          C = nsa_cuda_compressed_rows (= T / d, a capacity: rows past the real count of
 *          compressed tokens are padding); sel_idx int32.
 *   d_o:   bf16. grads: fp32, every present input's (all are required, overwritten).
 * The backward reads the forward's outputs except o (saved->o may be absent).
 * cu_seqlens: a device pointer to num_seqs + 1 int64 entries, or NULL for num_seqs sequences of
 * T / num_seqs tokens. It is not checked (that would need a host synchronisation): entries out of
 * order or outside [0, T] are clamped into some valid layout, so nothing is read out of bounds,
 * but the result is then that layout's. Check it on the host first where it comes from the host.
 * workspace: device memory of at least nsa_cuda_workspace_bytes (256-byte aligned), in use until
 * the stream has run the call's work (stream-ordered, e.g. a PyTorch tensor on that stream).
 * device: the CUDA device of all of it; the entry point makes it current on the calling thread
 * for the call and restores the previous one (so the caller's CUDA runtime, which may be another
 * copy than this library's, need not agree on the current device).
 * stream: a cudaStream_t of that device. Everything is enqueued on it; nothing allocates, frees,
 * copies to the host or synchronises, so a forward + backward can be captured into a CUDA graph –
 * after one uncaptured call on the thread and device with phi = mlp, which creates the cuBLAS
 * handle. */

/* NSA_OK when the CUDA entry points can run here (built with CUDA, a GPU present); otherwise
 * NSA_ERR_UNAVAILABLE and the reason ("built without CUDA", "no usable CUDA device"). */
NSA_CAPI int32_t nsa_cuda_available(char* err, size_t err_size);

/* Rows C of the compressed K/V outputs for total_tokens T in num_seqs sequences. */
NSA_CAPI int32_t nsa_cuda_compressed_rows(const NsaAttnConfig* cfg, int64_t total_tokens,
                                          int64_t num_seqs, int64_t* out, char* err,
                                          size_t err_size);

/* Workspace bytes of one forward (backward = 0), backward (1) or backward with bf16 gradients
 * (2: nsa_attention_backward_cuda_bf16) call on `device`. */
NSA_CAPI int32_t nsa_cuda_workspace_bytes(const NsaAttnConfig* cfg, int64_t total_tokens,
                                          int64_t num_seqs, int32_t backward, int32_t device,
                                          size_t* out, char* err, size_t err_size);

NSA_CAPI int32_t nsa_attention_forward_cuda(const NsaAttnConfig* cfg, const int64_t* cu_seqlens,
                                            int64_t num_seqs, const NsaAttnTensors* in,
                                            const NsaAttnSaved* out, void* workspace,
                                            size_t workspace_bytes, int32_t device, void* stream,
                                            char* err, size_t err_size);

NSA_CAPI int32_t nsa_attention_backward_cuda(const NsaAttnConfig* cfg, const int64_t* cu_seqlens,
                                             int64_t num_seqs, const NsaAttnTensors* in,
                                             const NsaAttnSaved* saved, const NsaTensorRef* d_o,
                                             const NsaAttnTensors* grads, void* workspace,
                                             size_t workspace_bytes, int32_t device, void* stream,
                                             char* err, size_t err_size);

/* The backward with the gradients of q, k, v and the gates in bf16 (the φ parameters' stay fp32):
 * what a bf16 caller wants, without a conversion pass of its own – the kernels that finish d_q and
 * the gate gradients write bf16 directly and the K/V gradients are converted in one launch; the
 * fp32 sums live in the workspace (nsa_cuda_workspace_bytes with backward = 2). The values are the
 * fp32 backward's, rounded to nearest even. */
NSA_CAPI int32_t nsa_attention_backward_cuda_bf16(
    const NsaAttnConfig* cfg, const int64_t* cu_seqlens, int64_t num_seqs, const NsaAttnTensors* in,
    const NsaAttnSaved* saved, const NsaTensorRef* d_o, const NsaAttnTensors* grads,
    void* workspace, size_t workspace_bytes, int32_t device, void* stream, char* err,
    size_t err_size);

#ifdef __cplusplus
}
#endif

#endif /* NSA_CAPI_H */
