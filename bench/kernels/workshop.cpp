// The kernel workshop: times single NSA CUDA kernels (or kernel variants) alone, on the state of
// one forward + backward of random inputs, so that each optimisation is measured against the
// kernel it replaces in the same process (the llm.c dev/cuda habit). Benchmarks only.
//
//   nsa_workshop --config m7c_125m --seq-len 16384 [--reps 20] [--sel-budget-mib N] KERNEL...
//
// --sel-budget-mib: the block-major selected branch's partial budget (its row chunk), default the
// layer's.
//
// Kernels: sel_fwd_query sel_fwd_block sel_dq_query sel_bwd_block cmp_fwd win_fwd select
// (select_q_global, select_q_shared: its Q rows forced to one place) cmp_dq win_dq cmp_win_dq (the
// two in one kernel) layer_fwd layer_bwd (layer_fwd_one_stream, layer_bwd_one_stream: without the
// fork), and dkdv_{cmp,sel,win}:CHUNKS (the dK/dV kernel with CHUNKS CTAs per unit, at most the
// layer's own count, plus the partials' sum). Prints one line per kernel: the median over the
// repetitions (CUDA events around each launch sequence; the block-major variants include their sort
// and merge).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "cuda/common/cuda_check.h"
#include "cuda/nsa/nsa_backward_dkdv.h"
#include "cuda/nsa/nsa_cuda_layer.h"
#include "cuda/nsa/nsa_kernels.h"
#include "guarded_main.h"
#include "nsa/presets.h"

namespace {

using nsa::cuda::Branch;
using nsa::cuda::NsaCudaLayer;

double median_ms(const std::function<void(cudaStream_t)>& run, cudaStream_t stream, int reps) {
  cudaEvent_t a, b;
  NSA_CUDA_CHECK(cudaEventCreate(&a));
  NSA_CUDA_CHECK(cudaEventCreate(&b));
  run(stream);  // warm-up
  std::vector<double> ms;
  for (int r = 0; r < reps; ++r) {
    NSA_CUDA_CHECK(cudaEventRecord(a, stream));
    run(stream);
    NSA_CUDA_CHECK(cudaEventRecord(b, stream));
    NSA_CUDA_CHECK(cudaEventSynchronize(b));
    float x = 0;
    NSA_CUDA_CHECK(cudaEventElapsedTime(&x, a, b));
    ms.push_back(x);
  }
  cudaEventDestroy(a), cudaEventDestroy(b);
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

int run(int argc, char** argv) {
  std::string config = "m7c_125m";
  int64_t seq_len = 16384;
  int reps = 20;
  int64_t sel_budget_mib = 0;
  std::vector<std::string> kernels;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--config" && i + 1 < argc) {
      config = argv[++i];
    } else if (arg == "--seq-len" && i + 1 < argc) {
      seq_len = std::atoll(argv[++i]);
    } else if (arg == "--reps" && i + 1 < argc) {
      reps = std::atoi(argv[++i]);
    } else if (arg == "--sel-budget-mib" && i + 1 < argc) {
      sel_budget_mib = std::atoll(argv[++i]);
    } else {
      kernels.push_back(arg);
    }
  }
  const nsa::NsaConfig cfg = nsa::attention_preset(config);
  const nsa::SeqLayout layout = nsa::SeqLayout::batch(1, seq_len);
  NsaCudaLayer layer(cfg, layout);
  layer.set_inputs(nsa::random_nsa_inputs<float>(cfg, seq_len, 1234));
  nsa::NsaConfig do_cfg = cfg;
  do_cfg.dk = cfg.dv;
  layer.set_output_grad(nsa::random_nsa_inputs<float>(do_cfg, seq_len, 99).q);
  cudaStream_t stream;
  NSA_CUDA_CHECK(cudaStreamCreate(&stream));
  layer.forward(stream);
  layer.backward(stream);  // also attaches the inverted selection index to the params
  NSA_CUDA_CHECK(cudaStreamSynchronize(stream));
  const nsa::cuda::NsaParams& p = layer.params();
  auto& bw = layer.backward_buffers();
  if (sel_budget_mib > 0) bw.sel_block_major.set_partial_budget(sel_budget_mib << 20);
  const auto* tiles = layer.row_tiles();
  const int64_t n_tiles = layer.num_row_tiles();
  const int64_t n_sel_units = layer.num_units(Branch::kSel);
  // A layer pass without the second stream (NsaCudaLayer::set_fork), for the *_one_stream kernels.
  const auto one_stream = [&](auto pass) {
    layer.set_fork(false);
    pass();
    layer.set_fork(true);
  };
  const std::map<std::string, std::function<void(cudaStream_t)>> table = {
      {"sel_fwd_query", [&](cudaStream_t s) { nsa::cuda::launch_selected_forward(p, s); }},
      {"sel_fwd_block",
       [&](cudaStream_t s) {
         nsa::cuda::run_sel_block_major_forward(p, bw.sel_block_major.view(p, n_sel_units), s);
       }},
      {"sel_dq_query", [&](cudaStream_t s) { nsa::cuda::launch_selected_dq(p, s); }},
      {"sel_bwd_block",  // the selected dK/dV with the fused dq and its merge
       [&](cudaStream_t s) {
         nsa::cuda::run_sel_block_major_backward(p, bw.sel_block_major.view(p, n_sel_units),
                                                 layer.units(Branch::kSel), n_sel_units, false, s);
       }},
      {"cmp_fwd",
       [&](cudaStream_t s) { nsa::cuda::launch_compressed_forward(p, tiles, n_tiles, s); }},
      {"win_fwd", [&](cudaStream_t s) { nsa::cuda::launch_window_forward(p, tiles, n_tiles, s); }},
      {"select", [&](cudaStream_t s) { nsa::cuda::launch_select_blocks(p, tiles, n_tiles, s); }},
      {"select_q_global",
       [&](cudaStream_t s) {
         nsa::cuda::launch_select_blocks(p, tiles, n_tiles, s, nsa::cuda::SelectQ::kGlobal);
       }},
      {"select_q_shared",
       [&](cudaStream_t s) {
         nsa::cuda::launch_select_blocks(p, tiles, n_tiles, s, nsa::cuda::SelectQ::kShared);
       }},
      {"cmp_dq", [&](cudaStream_t s) { nsa::cuda::launch_compressed_dq(p, tiles, n_tiles, s); }},
      {"win_dq", [&](cudaStream_t s) { nsa::cuda::launch_window_dq(p, tiles, n_tiles, s); }},
      {"cmp_win_dq",
       [&](cudaStream_t s) { nsa::cuda::launch_compressed_and_window_dq(p, tiles, n_tiles, s); }},
      {"layer_fwd", [&](cudaStream_t s) { layer.forward(s); }},
      {"layer_fwd_one_stream", [&](cudaStream_t s) { one_stream([&] { layer.forward(s); }); }},
      {"layer_bwd", [&](cudaStream_t s) { layer.backward(s); }},
      {"layer_bwd_one_stream", [&](cudaStream_t s) { one_stream([&] { layer.backward(s); }); }},
  };
  std::printf("config %s S %lld reps %d sel budget %lld MiB (median ms)\n", config.c_str(),
              static_cast<long long>(seq_len), reps,
              static_cast<long long>(bw.sel_block_major.partial_budget() >> 20));
  for (const std::string& k : kernels) {
    if (k.rfind("dkdv_", 0) == 0 && k.find(':') != std::string::npos) {
      const std::string name = k.substr(5, k.find(':') - 5);
      const int64_t chunks = std::atoll(k.c_str() + k.find(':') + 1);
      const Branch b = name == "cmp" ? Branch::kCmp : name == "sel" ? Branch::kSel : Branch::kWin;
      const auto dkdv = [&](cudaStream_t s) {
        nsa::cuda::launch_nsa_backward_dkdv(p, b, layer.units(b), layer.num_units(b), chunks, false,
                                            bw.partial.get(), s);
      };
      std::printf("%-16s %10.3f\n", k.c_str(), median_ms(dkdv, stream, reps));
      continue;
    }
    const auto it = table.find(k);
    if (it == table.end()) {
      std::fprintf(stderr, "nsa_workshop: unknown kernel '%s'; known:", k.c_str());
      for (const auto& [name, fn] : table) std::fprintf(stderr, " %s", name.c_str());
      std::fprintf(stderr, "\n");
      return 2;
    }
    std::printf("%-16s %10.3f\n", k.c_str(), median_ms(it->second, stream, reps));
    std::fflush(stdout);
  }
  cudaStreamDestroy(stream);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return guarded_main("nsa_workshop", run, argc, argv);
}
