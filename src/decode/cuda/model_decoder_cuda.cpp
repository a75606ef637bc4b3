// Incremental decoding on one GPU (see model_decoder_cuda.h).
#include "model_decoder_cuda.h"

#include <algorithm>

#include "cuda/common/convert.h"
#include "cuda/nsa/nsa_decode.h"
#include "model/cuda/decode_projection.h"
#include "model/cuda/model_cuda.h"
#include "model/cuda/skinny_gemm.h"
#include "nsa/error.h"

namespace nsa::cuda {
namespace {

// The decode kernels compress with φ = avg only (training and evaluation on the GPU take both).
const ModelConfig& checked_for_gpu_decoding(const ModelConfig& cfg) {
  checked_for_gpu(cfg);
  NSA_CHECK(cfg.attn.phi == Phi::kAvg,
            "--device cuda: decoding on the GPU supports phi = avg only (phi = mlp decodes on "
            "--device cpu)");
  return cfg;
}

void upload_f32(DeviceBuffer<float>& dst, const Tensor<float>& src) {
  dst.upload(src.ptr(), src.numel());
}

void upload_bf16(DeviceBuffer<bf16>& dst, const Tensor<float>& src) {
  DeviceBuffer<float> tmp;
  tmp.upload(src.ptr(), src.numel());
  dst.resize(src.numel());
  launch_f32_to_bf16(tmp.get(), dst.get(), src.numel(), nullptr);
  NSA_CUDA_CHECK(cudaStreamSynchronize(nullptr));
}

}  // namespace

ModelDecoderCuda::ModelDecoderCuda(const ModelConfig& cfg, const ModelParams<float>& params,
                                   int64_t batch, int64_t max_len, bool dense)
    : cfg_(checked_for_gpu_decoding(cfg)),
      B_(batch),
      max_len_(max_len),
      F_(cfg.ffn_hidden()),
      lens_(static_cast<size_t>(std::max<int64_t>(batch, 0)), 0),
      dense_(dense) {
  NSA_CHECK(batch > 0, "decode: the batch must hold at least one sequence, got ", batch);
  NSA_CHECK(max_len > 0 && max_len < (int64_t{1} << 31), "decode: max length ", max_len,
            " is outside [1, 2^31)");
  NSA_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  const NsaConfig& a = cfg.attn;
  const int64_t D = cfg.dim, H = a.heads, G = a.groups, B = batch;
  upload_f32(tok_emb_, params.tok_emb);
  upload_f32(norm_, params.norm);
  upload_bf16(head_, cfg.tie_embeddings ? params.tok_emb : params.output);
  // The fused input projection's rows (decode_inputs_layout): q, then k and v of every branch
  // with its own K/V (dense: the selected branch's only), then the gate logits (not dense).
  const auto needed = [&](int c) {
    return a.kv_index(c) == c && (!dense || c == a.kv_index(kSel));
  };
  const bool kv[kNumBranches] = {needed(0), needed(1), needed(2)};
  inputs_ = decode_inputs_layout(H, G, a.dk, a.dv, kv, !dense, a.gate == GateActivation::kSoftmax);
  const int64_t width = inputs_.width;
  for (const LayerParams<float>& p : params.layers) {
    LayerWeights w;
    upload_f32(w.attn_norm, p.attn_norm);
    upload_f32(w.bg, p.bg);
    upload_f32(w.ffn_norm, p.ffn_norm);
    Tensor<float> w_in({width, D});
    const auto put = [&](const Tensor<float>& t, int64_t row) {
      std::copy(t.data.begin(), t.data.end(), w_in.data.begin() + row * D);
    };
    put(p.wq, 0);
    for (int c = 0; c < kNumBranches; ++c) {
      if (!needed(c)) continue;
      put(p.wk[c], inputs_.k_offset[c]);
      put(p.wv[c], inputs_.v_offset[c]);
    }
    if (!dense) put(p.wg, inputs_.gate_offset);
    upload_bf16(w.w_in, w_in);
    upload_bf16(w.wo, p.wo);
    upload_bf16(w.w1, p.w1);
    upload_bf16(w.w2, p.w2);
    if (cfg.mlp == "swiglu") upload_bf16(w.w3, p.w3);
    layers_.push_back(std::move(w));
    // attention = full: a window as long as the caches (model_config.h).
    attn_.push_back(
        std::make_unique<NsaDecodeCuda>(cfg.layer_attention(max_len), B, max_len, dense));
  }
  tokens_.resize(B);
  tokens_.zero();
  positions_.resize(B);
  positions_.zero();
  x_.resize(B * D);
  proj_.resize(B * width);
  rstd_.resize(B);
  logits_.resize(B * cfg.vocab_size);
  h_.resize(B * D);
  q_.resize(B * H * a.dk);
  for (int c = 0; c < kNumBranches; ++c) {
    k_[c].resize(B * G * a.dk);
    v_[c].resize(B * G * a.dv);
    gates_[c].resize(B * H);
  }
  o_.resize(B * H * a.dv);
  u1_.resize(B * F_);
  u3_.resize(B * F_);
  m_.resize(B * F_);
  inputs_.q = q_.get();
  for (int c = 0; c < kNumBranches; ++c) {
    inputs_.k[c] = needed(c) ? k_[c].get() : nullptr;
    inputs_.v[c] = needed(c) ? v_[c].get() : nullptr;
    inputs_.gate[c] = dense ? nullptr : gates_[c].get();
    inputs_.enabled[c] = cfg.branch_enabled(c);
  }
  NSA_CUDA_CHECK(cudaDeviceSynchronize());
}

ModelDecoderCuda::~ModelDecoderCuda() {
  if (graph_) cudaGraphExecDestroy(graph_);
  if (stream_) cudaStreamDestroy(stream_);
}

bool ModelDecoderCuda::few_rows(int64_t in, const GemvInput& x, const bf16* w,
                                const bf16* w3) const {
  return B_ <= kGemvFasterRows && gemv_fits(B_, in, x, w, w3);
}

bool ModelDecoderCuda::small_linear(const GemvInput& x, const bf16* w, GemmOut y, int64_t in,
                                    int64_t out, float beta, cudaStream_t st) {
  if (few_rows(in, x, w)) {
    launch_gemv(x, w, y, B_, in, out, beta, st);
  } else if (skinny_gemm_fits(B_, in, x, w)) {
    launch_skinny_gemm(x, w, y, B_, in, out, beta, st);
  } else {
    return false;
  }
  return true;
}

bool ModelDecoderCuda::small_swiglu(const GemvInput& x, const bf16* w1, const bf16* w3,
                                    cudaStream_t st) {
  const int64_t D = cfg_.dim;
  if (few_rows(D, x, w1, w3)) {
    launch_gemv_swiglu(x, w1, w3, m_.get(), B_, D, F_, st);
  } else if (skinny_gemm_fits(B_, D, x, w1, w3)) {
    launch_skinny_swiglu(x, w1, w3, m_.get(), B_, D, F_, st);
  } else {
    return false;
  }
  return true;
}

void ModelDecoderCuda::rows_linear(const bf16* x, const bf16* w, GemmOut y, int64_t in, int64_t out,
                                   float beta, cudaStream_t st) {
  if (!small_linear(gemv_rows(x), w, y, in, out, beta, st))
    gemm_.linear_forward(x, w, y, B_, in, out, beta, st);
}

void ModelDecoderCuda::normed_linear(const float* norm_w, const bf16* w, GemmOut y, int64_t out,
                                     cudaStream_t st) {
  const int64_t D = cfg_.dim;
  const GemvInput x = gemv_normed_rows(x_.get(), norm_w, static_cast<float>(cfg_.norm_eps));
  if (small_linear(x, w, y, D, out, 0.0f, st)) return;  // the norm folded into the product
  launch_rmsnorm_forward(x.x_f32, norm_w, x.eps, h_.get(), rstd_.get(), B_, D, st);
  rows_linear(h_.get(), w, y, D, out, 0.0f, st);
}

void ModelDecoderCuda::attention_inputs(const LayerWeights& w, cudaStream_t st) {
  const int64_t D = cfg_.dim;
  const GemvInput x =
      gemv_normed_rows(x_.get(), w.attn_norm.get(), static_cast<float>(cfg_.norm_eps));
  // decode_projection_fits includes few_rows' gemv_fits.
  if (B_ <= kGemvFasterRows && decode_projection_fits(x, w.w_in.get(), inputs_, B_, D)) {
    launch_decode_projection(x, w.w_in.get(), inputs_, positions_.get(), w.bg.get(), cfg_.rope_base,
                             B_, D, st);
    return;
  }
  normed_linear(w.attn_norm.get(), w.w_in.get(), f32(proj_.get()), inputs_.width, st);
  launch_decode_inputs(proj_.get(), inputs_, positions_.get(), w.bg.get(), cfg_.rope_base, B_, st);
}

void ModelDecoderCuda::residual_linear(const bf16* x, const bf16* w, int64_t in, cudaStream_t st) {
  rows_linear(x, w, f32(x_.get()), in, cfg_.dim, 1.0f, st);
}

void ModelDecoderCuda::mlp_in(const LayerWeights& w, cudaStream_t st) {
  const int64_t D = cfg_.dim;
  const bf16* w3 = cfg_.mlp == "swiglu" ? w.w3.get() : nullptr;
  const GemvInput x =
      gemv_normed_rows(x_.get(), w.ffn_norm.get(), static_cast<float>(cfg_.norm_eps));
  if (small_swiglu(x, w.w1.get(), w3, st)) return;  // the norm, both products and m in one pass
  launch_rmsnorm_forward(x.x_f32, x.norm_w, x.eps, h_.get(), rstd_.get(), B_, D, st);
  rows_linear(h_.get(), w.w1.get(), b16(u1_.get()), D, F_, 0.0f, st);
  if (w3) rows_linear(h_.get(), w3, b16(u3_.get()), D, F_, 0.0f, st);
  launch_swiglu_forward(u1_.get(), w3 ? u3_.get() : nullptr, m_.get(), B_ * F_, st);
}

void ModelDecoderCuda::record_step() {
  const NsaConfig& a = cfg_.attn;
  const int64_t B = B_, D = cfg_.dim, H = a.heads;
  cudaStream_t st = stream_;
  launch_embedding_forward(tokens_.get(), tok_emb_.get(), x_.get(), B, D, st);
  for (size_t li = 0; li < layers_.size(); ++li) {
    const LayerWeights& w = layers_[li];
    attention_inputs(w, st);
    const bf16* k[kNumBranches];
    const bf16* v[kNumBranches];
    const bf16* gates[kNumBranches];
    for (int c = 0; c < kNumBranches; ++c) {
      k[c] = k_[a.kv_index(c)].get();
      v[c] = v_[a.kv_index(c)].get();
      gates[c] = gates_[c].get();
    }
    attn_[li]->step(q_.get(), k, v, gates, positions_.get(), o_.get(), st);
    residual_linear(o_.get(), w.wo.get(), H * a.dv, st);
    mlp_in(w, st);
    residual_linear(m_.get(), w.w2.get(), F_, st);
  }
  normed_linear(norm_.get(), head_.get(), f32(logits_.get()), cfg_.vocab_size, st);
  launch_advance_positions(positions_.get(), B, st);
}

void ModelDecoderCuda::step_async() {
  NSA_CHECK(position() < max_len_, "decode: the caches hold ", max_len_,
            " tokens per sequence and are full (raise the maximum length)");
  if (!graph_) {
    cudaGraph_t g = nullptr;
    NSA_CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
    record_step();
    NSA_CUDA_CHECK(cudaStreamEndCapture(stream_, &g));
    NSA_CUDA_CHECK(cudaGraphInstantiate(&graph_, g, 0));
    NSA_CUDA_CHECK(cudaGraphDestroy(g));
  }
  NSA_CUDA_CHECK(cudaGraphLaunch(graph_, stream_));
  for (int64_t& len : lens_) ++len;
}

void ModelDecoderCuda::enable_trace() {
  NSA_CHECK(!dense_, "decode trace: the phase timestamps are NSA's (dense decoding has none)");
  for (const auto& layer : attn_) layer->enable_trace(stream_, 1);
  if (graph_) NSA_CUDA_CHECK(cudaGraphExecDestroy(graph_));
  graph_ = nullptr;  // captured again, with the traced kernels
}

NsaDecodeCuda::Trace ModelDecoderCuda::trace() const {
  NsaDecodeCuda::Trace all;
  for (const auto& layer : attn_) all.append(layer->trace());
  return all;
}

std::vector<float> ModelDecoderCuda::step(const std::vector<int32_t>& tokens) {
  NSA_CHECK(static_cast<int64_t>(tokens.size()) == B_, "decode: ", tokens.size(),
            " tokens for a batch of ", B_);
  for (size_t i = 0; i < tokens.size(); ++i) {
    NSA_CHECK(tokens[i] >= 0 && tokens[i] < cfg_.vocab_size, "decode: token ", tokens[i],
              " of sequence ", i, " is outside the vocabulary [0, ", cfg_.vocab_size, ")");
  }
  NSA_CUDA_CHECK(cudaMemcpyAsync(tokens_.get(), tokens.data(), tokens.size() * sizeof(int32_t),
                                 cudaMemcpyHostToDevice, stream_));
  step_async();
  std::vector<float> out(static_cast<size_t>(B_ * cfg_.vocab_size));
  NSA_CUDA_CHECK(cudaMemcpyAsync(out.data(), logits_.get(), out.size() * sizeof(float),
                                 cudaMemcpyDeviceToHost, stream_));
  NSA_CUDA_CHECK(cudaStreamSynchronize(stream_));
  return out;
}

void ModelDecoderCuda::fill_random(int64_t len, uint64_t seed) {
  NSA_CHECK(len >= 0 && len < max_len_, "decode: fill length ", len, " is outside [0, ", max_len_,
            ")");
  for (size_t li = 0; li < attn_.size(); ++li) attn_[li]->fill_random(len, seed + li, stream_);
  lens_.assign(lens_.size(), len);
  upload_positions();
}

void ModelDecoderCuda::reset() {
  lens_.assign(lens_.size(), 0);
  upload_positions();
}

void ModelDecoderCuda::upload_positions() {
  const std::vector<int32_t> pos(lens_.begin(), lens_.end());
  NSA_CUDA_CHECK(cudaMemcpyAsync(positions_.get(), pos.data(), pos.size() * sizeof(int32_t),
                                 cudaMemcpyHostToDevice, stream_));
  NSA_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

int64_t ModelDecoderCuda::position() const {
  return lens_.empty() ? 0 : *std::max_element(lens_.begin(), lens_.end());
}

std::vector<int32_t> ModelDecoderCuda::selection(int64_t layer) const {
  NSA_CHECK(!dense_, "decode: dense decoding selects no blocks");
  NSA_CHECK(layer >= 0 && layer < static_cast<int64_t>(attn_.size()), "decode: layer ", layer,
            " is outside [0, ", attn_.size(), ")");
  const NsaConfig& a = cfg_.attn;
  std::vector<int32_t> out(static_cast<size_t>(B_ * a.groups * a.n_sel));
  NSA_CUDA_CHECK(cudaStreamSynchronize(stream_));
  NSA_CUDA_CHECK(cudaMemcpy(out.data(), attn_[layer]->selection(), out.size() * sizeof(int32_t),
                            cudaMemcpyDeviceToHost));
  return out;
}

int64_t ModelDecoderCuda::kv_bytes_per_step() const {
  int64_t total = 0;
  for (const auto& a : attn_) {
    for (int64_t len : lens_) total += a->kv_bytes_per_step(len);
  }
  return total;
}

size_t ModelDecoderCuda::device_bytes() const {
  size_t total = tok_emb_.bytes() + norm_.bytes() + head_.bytes() + logits_.bytes();
  for (const LayerWeights& w : layers_) {
    total += w.attn_norm.bytes() + w.bg.bytes() + w.ffn_norm.bytes() + w.w_in.bytes() +
             w.wo.bytes() + w.w1.bytes() + w.w2.bytes() + w.w3.bytes();
  }
  for (const auto& a : attn_) total += a->bytes();
  return total;
}

}  // namespace nsa::cuda
