// The GPU training backend (see train_model_cuda.h).
#include "train_model_cuda.h"

#include <cstdlib>
#include <memory>
#include <string>

#include "adamw_cuda.h"
#include "cuda/device.h"
#include "model/cuda/model_cuda.h"
#ifdef NSA_HAVE_NCCL
#include "dist/nccl/nccl_reducer.h"
#endif

namespace nsa::cuda {
namespace {

// NSA_GPU_ALLREDUCE: how a GPU rank sums gradients where NCCL is built in – `nccl` (the default)
// in one all-reduce after the backward; `overlap` during the backward, a part as soon as it is
// final (on two H200s over NVLink 1 % slower than `nccl`: the sums' kernels take SMs from the
// backward's, and the whole sum costs only 2 % of a step – docs/training.md; for links where the
// sum costs more); `host` through host memory and the host communicator. Read once, when the
// backend is made: a wrong value stops the run before its first step.
enum class AllreduceMode { kNccl, kOverlap, kHost };
AllreduceMode allreduce_mode() {
  const char* v = std::getenv("NSA_GPU_ALLREDUCE");
  const std::string mode = v ? v : "";
  if (mode.empty() || mode == "nccl") return AllreduceMode::kNccl;
  if (mode == "overlap") return AllreduceMode::kOverlap;
  NSA_CHECK(mode == "host", "NSA_GPU_ALLREDUCE='", mode,
            "': use 'nccl' (the default where built), 'overlap' or 'host'");
  return AllreduceMode::kHost;
}

class TrainModelCuda : public TrainModel {
 public:
  TrainModelCuda(const ModelConfig& cfg, const SeqLayout& layout, const AdamWConfig& adam,
                 Recompute recompute)
      : cfg_(cfg),
        adam_(adam),
        model_(cfg, layout, recompute),
        optimizer_(model_),
        params_(init_model_params<float>(cfg)),
        allreduce_(allreduce_mode()) {
    for (const auto& [name, t] : params_.named(cfg_)) {
      m_.emplace_back(t->shape);
      v_.emplace_back(t->shape);
    }
    model_.set_params(params_);  // the same seeded initialisation as the CPU backend
  }
  ~TrainModelCuda() override {
#ifdef NSA_HAVE_NCCL
    // Neither waits: after a failure the sums may never end (a rank gone), and the process must.
    for (cudaEvent_t e : part_done_) cudaEventDestroy(e);
    if (sums_done_) cudaEventDestroy(sums_done_);
    if (sum_stream_) cudaStreamDestroy(sum_stream_);
#endif
  }
  TrainModelCuda(const TrainModelCuda&) = delete;
  TrainModelCuda& operator=(const TrainModelCuda&) = delete;

  void zero_grads() override {
    mark(StepPhase::kOther);  // a step starts here (phase timing)
    model_.zero_grads();
  }
  double forward_backward(const Batch& b, bool backward, ModelStats* stats) override {
    return model_.forward_backward(b.inputs, b.targets, backward, stats);
  }
#ifdef NSA_HAVE_NCCL
  // NSA_GPU_ALLREDUCE=overlap: each part of the gradient buffer is summed on a stream of its own
  // as soon as the backward has made it final (ModelCuda::set_grads_ready), so that the sums
  // overlap the rest of the backward; allreduce_grads waits for them. The parts cover the buffer
  // once; with two ranks every element is the same sum as the one all-reduce's, bit for bit.
  void begin_gradient_sum(Communicator& comm) override {
    if (allreduce_ != AllreduceMode::kOverlap) return;
    NcclReducer& reducer = nccl(comm);
    if (!sum_stream_) {
      NSA_CUDA_CHECK(cudaStreamCreateWithFlags(&sum_stream_, cudaStreamNonBlocking));
      NSA_CUDA_CHECK(cudaEventCreateWithFlags(&sums_done_, cudaEventDisableTiming));
    }
    summed_ = 0;
    parts_ = 0;
    model_.set_grads_ready([this, &reducer](int64_t lo, int64_t hi) {
      if (static_cast<size_t>(parts_) == part_done_.size()) {
        part_done_.emplace_back();
        NSA_CUDA_CHECK(cudaEventCreateWithFlags(&part_done_.back(), cudaEventDisableTiming));
      }
      cudaEvent_t done = part_done_[static_cast<size_t>(parts_++)];
      NSA_CUDA_CHECK(cudaEventRecord(done, model_.stream()));
      NSA_CUDA_CHECK(cudaStreamWaitEvent(sum_stream_, done, 0));
      reducer.allreduce_sum(model_.grads_device() + lo, hi - lo, sum_stream_);
      summed_ += hi - lo;
    });
  }
#endif
  // GPU to GPU with NCCL when the build has it – here in one all-reduce, or during the backward
  // (NSA_GPU_ALLREDUCE=overlap, begin_gradient_sum); NSA_GPU_ALLREDUCE=host, or a build without
  // NCCL: through host memory and the host communicator.
  void allreduce_grads(Communicator& comm) override {
    mark(StepPhase::kCommunication);
#ifdef NSA_HAVE_NCCL
    model_.set_grads_ready(nullptr);
    if (parts_ > 0) {  // begun during the backward: the model's stream waits for its sums
      NSA_CHECK(summed_ == model_.grads_size(), "gradient sum: the backward's parts cover ",
                summed_, " of the ", model_.grads_size(), " elements");
      parts_ = 0;
      NSA_CUDA_CHECK(cudaEventRecord(sums_done_, sum_stream_));
      NSA_CUDA_CHECK(cudaStreamWaitEvent(model_.stream(), sums_done_, 0));
      return;
    }
    if (allreduce_ != AllreduceMode::kHost) {
      nccl(comm).allreduce_sum(model_.grads_device(), model_.grads_size(), model_.stream());
      return;
    }
#endif
    model_.params().download_grads_flat(flat_);
    comm.allreduce_sum(flat_.data(), static_cast<int64_t>(flat_.size()));
    model_.params().upload_grads_flat(flat_);
  }
  // ZeRO-1: rank r keeps the moments of, and updates, the r-th of `world` equal slices of the
  // flat parameter buffer; after each step the updated weights are put together – GPU to GPU with
  // NCCL where the build has it (NSA_GPU_ALLREDUCE=host: through host memory and the host
  // communicator, as without NCCL), then every bf16 copy is made again from them.
  void shard_optimizer_state(Communicator& comm) override {
    offsets_ = Communicator::even_ranges(optimizer_.flat_size(), comm.world());
    optimizer_.shard(offsets_[comm.rank()], offsets_[comm.rank() + 1]);
    zero_comm_ = &comm;
  }
  double optimizer_step(int64_t step, double grad_scale) override {
    const double norm = optimizer_.step(adam_, step, grad_scale);
    if (zero_comm_) {
      mark(StepPhase::kCommunication);
      gather_weight_slices();
    }
    model_.phase_timer().stop(model_.stream());  // the step ends here
    return norm;
  }
  NamedTensors named_params() override {
    return params_.named(cfg_);
  }
  std::vector<Tensor<float>>& adam_m() override {
    return m_;
  }
  std::vector<Tensor<float>>& adam_v() override {
    return v_;
  }
  void pull() override {  // on every rank: with ZeRO-1 the moments are gathered
    model_.get_params(params_);
    optimizer_.get_state(m_, v_, [this](std::vector<float>& flat) {
      zero_comm_->allgather_ranges(flat.data(), offsets_);
    });
  }
  void push() override {
    model_.set_params(params_);
    optimizer_.set_state(m_, v_);
  }
  size_t device_bytes() const override {
    return model_.device_bytes() + optimizer_.device_bytes();
  }
  const char* device() const override {
    return "cuda";
  }
  void time_phases(bool on) override {
    model_.phase_timer().set_enabled(on);
  }
  bool take_phase_times(StepPhaseTimes& out) override {
    return model_.phase_timer().collect(out);
  }

 private:
  void mark(StepPhase phase) {
    model_.phase_timer().mark(phase, model_.stream());
  }
  // ZeRO-1: every rank's updated slice of the weights onto every rank, the bf16 copies made again.
  void gather_weight_slices() {
#ifdef NSA_HAVE_NCCL
    if (allreduce_ != AllreduceMode::kHost) {
      ModelParamsCuda& params = model_.params();
      nccl(*zero_comm_).allgather_ranges(params.weights_flat(), offsets_, model_.stream());
      params.refresh_bf16();
      return;
    }
#endif
    optimizer_.download_weight_slice(flat_);
    zero_comm_->allgather_ranges(flat_.data(), offsets_);
    model_.params().upload_weights_flat(flat_);
  }
#ifdef NSA_HAVE_NCCL
  NcclReducer& nccl(Communicator& comm) {  // made at first use, on every rank at the same step
    if (!nccl_) nccl_ = std::make_unique<NcclReducer>(comm);
    return *nccl_;
  }
#endif

  ModelConfig cfg_;
  AdamWConfig adam_;
  ModelCuda model_;
  AdamWCuda optimizer_;
  ModelParams<float> params_;
  [[maybe_unused]] AllreduceMode allreduce_;  // NSA_GPU_ALLREDUCE (unused in a build without NCCL)
  std::vector<Tensor<float>> m_, v_;
  std::vector<float> flat_;
  Communicator* zero_comm_ = nullptr;  // ZeRO-1
  std::vector<int64_t> offsets_;       // ZeRO-1: rank r owns flat elements [offsets_[r], +1)
#ifdef NSA_HAVE_NCCL
  std::unique_ptr<NcclReducer> nccl_;
  // begin_gradient_sum: the stream of the sums, an event a part (reused step after step), the
  // parts and elements summed this step, the sums' end.
  cudaStream_t sum_stream_ = nullptr;
  std::vector<cudaEvent_t> part_done_;
  int64_t parts_ = 0, summed_ = 0;
  cudaEvent_t sums_done_ = nullptr;
#endif
};

}  // namespace

std::unique_ptr<TrainModel> make_train_model_cuda(const ModelConfig& cfg, const SeqLayout& layout,
                                                  const AdamWConfig& adam, Recompute recompute) {
  select_local_device();  // one GPU per rank of a node
  return std::make_unique<TrainModelCuda>(cfg, layout, adam, recompute);
}

}  // namespace nsa::cuda
