// Programmatic dependent launch (Hopper): a chain of small dependent kernels – the decode step's –
// costs a launch gap at every boundary. Launched with launch_dependent, a kernel's CTAs may be
// scheduled while the kernel before it still runs; each such kernel calls
// wait_for_previous_kernel(), which blocks until the previous one has finished and its writes
// are visible, and then lets the next kernel launch. So at most one kernel runs ahead: before
// that call a kernel may read what the kernels two or more back wrote (or what never changes –
// weights, cache rows of earlier steps), never what the one before writes, and may write
// nothing; the order of the stream is kept exactly. A kernel may instead wait with
// wait_for_previous_kernel_only() and let the next one launch later (let_next_kernel_start()):
// where it does so changes only when the next kernel's CTAs are scheduled, never what they see.
// Early start: a kernel may also call let_next_kernel_start() before its own wait, so that the next
// kernel's CTAs can be scheduled while the kernel two back still runs. That kernel's wait still
// covers everything before it (its prerequisite waited for its own), but before its wait it may
// then read only what kernels three or more back wrote – the decode step's attention inputs do
// this: the attention's first kernel reads cache rows of earlier steps before its wait.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <utility>

#include "cuda_check.h"

namespace nsa::cuda {

// wait_for_previous_kernel without letting the next kernel start: for a kernel that calls
// let_next_kernel_start later, so that the next kernel's prologue (its loads before its own wait)
// does not compete with this one's latency-bound first phases.
__device__ __forceinline__ void wait_for_previous_kernel_only() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// Let the next kernel's CTAs be scheduled now, so that what they load before their wait overlaps
// this kernel: the second half of wait_for_previous_kernel, or alone – in a kernel that is not
// itself a dependent launch but is followed by one, or after wait_for_previous_kernel_only. The
// next kernel's wait still sees all of this one's writes.
__device__ __forceinline__ void let_next_kernel_start() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;");
#endif
}

// The usual dependent kernel's wait (the file's top comment): the two halves at once.
__device__ __forceinline__ void wait_for_previous_kernel() {
  wait_for_previous_kernel_only();
  let_next_kernel_start();
}

// The launch attribute of clusters of cluster_x CTAs along the grid's x dimension.
inline cudaLaunchAttribute cluster_attribute(unsigned cluster_x) {
  cudaLaunchAttribute a{};
  a.id = cudaLaunchAttributeClusterDimension;
  a.val.clusterDim.x = cluster_x;
  a.val.clusterDim.y = 1;
  a.val.clusterDim.z = 1;
  return a;
}

// cluster_x > 0: the grid's x dimension is split into clusters of cluster_x CTAs (a multiple),
// which can meet at a cluster barrier (cluster_arrive_relaxed, cluster_wait) and store into each
// other's shared memory (cluster_address, st_async_cluster; a cluster of one too). 0: no cluster.
template <typename... Params, typename... Args>
void launch_dependent_clusters(void (*kernel)(Params...), dim3 grid, unsigned cluster_x, dim3 block,
                               size_t smem, cudaStream_t stream, Args&&... args) {
  cudaLaunchAttribute attrs[2]{};
  attrs[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attrs[0].val.programmaticStreamSerializationAllowed = 1;
  attrs[1] = cluster_attribute(cluster_x);
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  config.attrs = attrs;
  config.numAttrs = cluster_x > 0 ? 2 : 1;
  NSA_CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...));
  NSA_CUDA_LAUNCH_CHECK();
}

template <typename... Params, typename... Args>
void launch_dependent(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem,
                      cudaStream_t stream, Args&&... args) {
  launch_dependent_clusters(kernel, grid, 0, block, smem, stream, std::forward<Args>(args)...);
}

// A cluster barrier in two halves, so that work can run between them. Every thread of every CTA of
// the cluster arrives, then waits until all have. The relaxed arrival orders no memory operation of
// its own (a release arrival would wait for the thread's earlier loads and stores, a membar that
// profiles showed costly); what must be seen across it is published otherwise – mbarriers'
// initialisation by fence.mbarrier_init (tma.cuh) before the arrival.
__device__ __forceinline__ void cluster_arrive_relaxed() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");
#endif
}

__device__ __forceinline__ void cluster_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory");
#endif
}

// The address of `p` (this CTA's shared memory) in the shared memory of CTA `rank` of the cluster
// (distributed shared memory), for st_async_cluster.
__device__ __forceinline__ uint32_t cluster_address(const void* p, int rank) {
  uint32_t out = 0;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  const uint32_t local = static_cast<uint32_t>(__cvta_generic_to_shared(p));
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(out) : "r"(local), "r"(rank));
#endif
  return out;
}

// Asynchronous stores into the shared memory of a CTA of the cluster (`address` from
// cluster_address), each completing its bytes on that CTA's mbarrier `bar` (also mapped there): the
// receiver's wait on the barrier's phase (mbarrier_wait_cluster, tma.cuh) makes them visible – the
// completion releases at cluster scope. The receiver must have initialised the barrier, and the
// cluster met since (a barrier's arrival after fence.mbarrier_init), before the first store.
__device__ __forceinline__ void st_async_cluster(uint32_t address, float4 v, uint32_t bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile(
      "st.async.weak.shared::cluster.mbarrier::complete_tx::bytes.v4.b32 [%0], {%1, %2, %3, %4}, "
      "[%5];" ::"r"(address),
      "r"(__float_as_uint(v.x)), "r"(__float_as_uint(v.y)), "r"(__float_as_uint(v.z)),
      "r"(__float_as_uint(v.w)), "r"(bar)
      : "memory");
#endif
}

__device__ __forceinline__ void st_async_cluster(uint32_t address, float2 v, uint32_t bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile(
      "st.async.weak.shared::cluster.mbarrier::complete_tx::bytes.v2.b32 [%0], {%1, %2}, [%3];" ::
          "r"(address),
      "r"(__float_as_uint(v.x)), "r"(__float_as_uint(v.y)), "r"(bar)
      : "memory");
#endif
}

}  // namespace nsa::cuda
