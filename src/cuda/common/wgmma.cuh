// Hopper warpgroup MMA (`wgmma.mma_async`, sm_90a) for bf16 with fp32 accumulators: shared-memory
// matrix descriptors for 128-byte-swizzled tiles, the m64n64k16 instruction with both operands in
// shared memory (SS) or A in registers (RS), and the fences around them. The building block of
// the FA3-class kernels (docs/cuda.md, "Building blocks"); tests/cuda/test_wgmma.cu checks every
// layout here against a CPU product.
//
// Layouts. A tile of R rows × 64 bf16 (128 bytes per row) is stored with 128-byte swizzling: the
// 16-byte chunk c of row r lives at chunk c ^ (r % 8) of that row (sw128_offset), and the tile
// starts on a 1024-byte boundary. As the K-major operand of an m64nNk16 product (A: M × K, B: N ×
// K, K contiguous) such a tile is described with the stride between 8-row groups (1024 bytes); the
// k-th step of 16 elements starts 32·k bytes further. As an MN-major B (K × N with N contiguous,
// e.g. V for P·V), the k-th step of 16 rows starts 16·128 bytes further.
//
// Accumulators (m64nN, fp32): warp w of the warpgroup holds rows 16w..16w+15; d[4j + e] is row
// 16w + lane/4 + 8·(e/2), column 8j + 2·(lane%4) + e%2 – the mma.sync m16n8 C layout, N/8 times.
// A register fragments (RS) follow the mma.sync m16n8k16 A layout per warp.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

namespace nsa::cuda {

// Byte offset of element (r, c) (c < 64) in a 128-byte-swizzled tile of bf16 rows.
__host__ __device__ constexpr uint32_t sw128_offset(uint32_t r, uint32_t c) {
  return r * 128u + ((((c >> 3) ^ (r & 7u)) & 7u) << 4) + (c & 7u) * 2u;
}

// Descriptor of a 128-byte-swizzled operand at shared address `smem` (1024-byte aligned for the
// first step; later steps add their byte offset, which keeps the swizzle phase): leading byte
// offset `lbo`, stride byte offset `sbo`.
__device__ __forceinline__ uint64_t sw128_desc(const void* smem, uint32_t lbo, uint32_t sbo) {
  const uint32_t addr = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  return static_cast<uint64_t>((addr & 0x3FFFFu) >> 4) |
         (static_cast<uint64_t>((lbo & 0x3FFFFu) >> 4) << 16) |
         (static_cast<uint64_t>((sbo & 0x3FFFFu) >> 4) << 32) | (uint64_t{1} << 62);
}
// The descriptor of a tile (K-major and MN-major share it), and of a byte `offset` (a multiple of
// 16) past it: the address field counts 16-byte units and shared memory lies below 256 KB, so an
// addition cannot carry into the next field. Kernels build one descriptor per tile and add
// compile-time offsets instead of rebuilding each step's descriptor (Nsight Compute counted the
// rebuilding among the dq kernel's busiest lines).
__device__ __forceinline__ uint64_t sw128_tile_desc(const void* tile) {
  return sw128_desc(tile, 16, 1024);
}
__device__ __forceinline__ uint64_t desc_at(uint64_t tile_desc, uint32_t offset) {
  return tile_desc + (offset >> 4);
}
// K-major operand (rows of 64 K-elements): step k (16 elements) of the tile at `tile`.
__device__ __forceinline__ uint64_t kmajor_desc(const void* tile, int k) {
  return sw128_desc(static_cast<const unsigned char*>(tile) + 32 * k, 16, 1024);
}
// MN-major B operand (rows of 64 N-elements, one row per k): step k (16 rows) of `tile`.
__device__ __forceinline__ uint64_t mnmajor_desc(const void* tile, int k) {
  return sw128_desc(static_cast<const unsigned char*>(tile) + 16 * 128 * k, 16, 1024);
}

// Orders this thread's earlier generic-proxy shared-memory writes before async-proxy reads
// (wgmma, TMA); call before the barrier that publishes a tile written with ordinary stores.
__device__ __forceinline__ void fence_proxy_async_smem() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
__device__ __forceinline__ void wgmma_fence() {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void wgmma_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
// Waits until at most N committed groups of this warpgroup are still running.
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}

// Named barrier `id` (1..15; 0 is __syncthreads) of n threads, non-.aligned: the warpgroups of a
// hand-off may reach it from different places in the code (each after its own work of the step).
// Shared-memory writes before it are visible to every participant after it.
__device__ __forceinline__ void named_barrier_sync(int id, int n) {
  asm volatile("barrier.sync %0, %1;\n" ::"r"(id), "r"(n) : "memory");
}

#define NSA_WGMMA_D32                                                                           \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, " \
  "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}"
#define NSA_WGMMA_D32_OUT(d)                                                                      \
  "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), \
      "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]),    \
      "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]),  \
      "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]),  \
      "+f"(d[29]), "+f"(d[30]), "+f"(d[31])

// d (64 × 64, fp32) = A·B (+ d if accumulate): A and B K-major in shared memory (B: N × K), or B
// MN-major (K × N) with kTransB.
template <bool kTransB = false>
__device__ __forceinline__ void wgmma_m64n64k16_ss(float d[32], uint64_t a, uint64_t b,
                                                   bool accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " NSA_WGMMA_D32
      ", %32, %33, p, 1, 1, 0, %35;\n}\n"
      : NSA_WGMMA_D32_OUT(d)
      : "l"(a), "l"(b), "r"(static_cast<int>(accumulate)), "n"(kTransB ? 1 : 0));
}

// d (64 × 64, fp32) = A·B (+ d if accumulate) with A (64 × 16) in registers (four b32 per thread,
// the mma.sync A layout per warp) and B in shared memory as above.
template <bool kTransB = false>
__device__ __forceinline__ void wgmma_m64n64k16_rs(float d[32], const uint32_t a[4], uint64_t b,
                                                   bool accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " NSA_WGMMA_D32
      ", {%32, %33, %34, %35}, %36, p, 1, 1, %38;\n}\n"
      : NSA_WGMMA_D32_OUT(d)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(static_cast<int>(accumulate)),
        "n"(kTransB ? 1 : 0));
}

#undef NSA_WGMMA_D32
#undef NSA_WGMMA_D32_OUT

}  // namespace nsa::cuda
