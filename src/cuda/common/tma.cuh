// Tensor maps for the bulk tensor copy engine (TMA, Hopper): the device half. One thread arms an
// mbarrier with the bytes it expects and issues the copies; every consumer waits on the barrier's
// phase, which also makes the copied bytes visible to it (and to wgmma). The maps come from
// tma.h and reach the kernel by value as a __grid_constant__ parameter.
#pragma once

#include <cuda.h>

#include <cstdint>
#include <cuda/ptx>

namespace nsa::cuda {

// Barrier `bar` (shared memory) completes a phase on one arrival plus the transaction bytes.
__device__ __forceinline__ void mbarrier_init_one(uint64_t* bar) {
  ::cuda::ptx::mbarrier_init(bar, 1u);
}
// Makes initialised barriers visible to the copy engine (before the block's barrier that
// publishes them).
__device__ __forceinline__ void mbarrier_init_fence() {
  ::cuda::ptx::fence_mbarrier_init(::cuda::ptx::sem_release, ::cuda::ptx::scope_cluster);
}
// The one arrival of the phase, announcing `bytes` of copies that will complete on `bar`.
__device__ __forceinline__ void mbarrier_expect_bytes(uint64_t* bar, uint32_t bytes) {
  ::cuda::ptx::mbarrier_arrive_expect_tx(::cuda::ptx::sem_release, ::cuda::ptx::scope_cta,
                                         ::cuda::ptx::space_shared, bar, bytes);
}
// Waits until the phase of parity `parity` of `bar` has completed.
__device__ __forceinline__ void mbarrier_wait(uint64_t* bar, uint32_t parity) {
  while (!::cuda::ptx::mbarrier_try_wait_parity(bar, parity)) {
  }
}
// The same for bytes that other CTAs of the cluster store (st_async_cluster): acquire at cluster
// scope, which their stores' completions release at.
__device__ __forceinline__ void mbarrier_wait_cluster(uint64_t* bar, uint32_t parity) {
  while (!::cuda::ptx::mbarrier_try_wait_parity(::cuda::ptx::sem_acquire,
                                                ::cuda::ptx::scope_cluster, bar, parity)) {
  }
}
// Copies the box at (column, group, row) of `map` (tma.h: 64 columns × the map's box rows) to
// `dst` (shared, 1024-byte aligned), completing on `bar`.
__device__ __forceinline__ void tma_load_box(void* dst, const CUtensorMap* map, int32_t column,
                                             int32_t group, int32_t row, uint64_t* bar) {
  const int32_t coords[3] = {column, group, row};
  ::cuda::ptx::cp_async_bulk_tensor(::cuda::ptx::space_cluster, ::cuda::ptx::space_global, dst, map,
                                    coords, bar);
}

// Copies the box at (column, row) of a two-dimensional `map` (tma.h, make_row_box_map) to `dst`
// (shared, 128-byte aligned; under the 128-byte swizzle the rows' XOR pattern follows the
// address's bits 7–9: decode_tile.cuh's key_piece phase), completing on `bar`.
__device__ __forceinline__ void tma_load_box_2d(void* dst, const CUtensorMap* map, int32_t column,
                                                int32_t row, uint64_t* bar) {
  const int32_t coords[2] = {column, row};
  ::cuda::ptx::cp_async_bulk_tensor(::cuda::ptx::space_cluster, ::cuda::ptx::space_global, dst, map,
                                    coords, bar);
}

}  // namespace nsa::cuda
