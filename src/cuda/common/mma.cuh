// Warp-level tensor-core tiles: mma.sync m16n8k16 (bf16 × bf16 → fp32) and the fragment loads
// the attention kernels need, from bf16 tiles in shared memory.
//
// Fragment layout (PTX ISA, m16n8k16, bf16): with gid = lane / 4 and tq = lane % 4,
//   A (16 × 16, row-major): a0 = (gid, 2tq..+1), a1 = (gid+8, 2tq..+1), a2 = (gid, 2tq+8..+9),
//                           a3 = (gid+8, 2tq+8..+9)
//   B (16 × 8):             b0 = (k 2tq..+1, n gid),  b1 = (k 2tq+8..+9, n gid)
//   C (16 × 8, fp32):       c0,c1 = (gid, 2tq..+1),  c2,c3 = (gid+8, 2tq..+1)
// so the C fragments of two adjacent 8-column tiles are, packed to bf16, the A fragment of one
// 16-wide k step (the flash-attention register trick: P = softmax(S) never leaves registers).
// Shared tiles are row-major with a row stride of cols + 8 elements (`tile_stride`), which makes
// every fragment load below free of bank conflicts.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

namespace nsa::cuda {

__host__ __device__ constexpr int tile_stride(int cols) {
  return cols + 8;
}

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

__device__ __forceinline__ uint32_t pack_bf16(__nv_bfloat16 lo, __nv_bfloat16 hi) {
  return static_cast<uint32_t>(__bfloat16_as_ushort(lo)) |
         (static_cast<uint32_t>(__bfloat16_as_ushort(hi)) << 16);
}

// c += a · b for one m16n8k16 tile.
__device__ __forceinline__ void mma_16816(float c[4], const uint32_t a[4], const uint32_t b[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

__device__ __forceinline__ uint32_t ld_u32(const __nv_bfloat16* p) {
  return *reinterpret_cast<const uint32_t*>(p);
}

// ldmatrix: four 8 × 8 b16 matrices from shared memory; lane l gives the address of row l % 8 of
// matrix l / 8. Without .trans thread T receives (row T/4, columns 2(T%4)..+1) of each matrix;
// with .trans (rows 2(T%4)..+1, column T/4).
__device__ __forceinline__ void ldmatrix_x4(uint32_t r[4], const __nv_bfloat16* row_addr) {
  const uint32_t s = static_cast<uint32_t>(__cvta_generic_to_shared(row_addr));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(s));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t r[4], const __nv_bfloat16* row_addr) {
  const uint32_t s = static_cast<uint32_t>(__cvta_generic_to_shared(row_addr));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(s));
}

// The transpose of an 8 × 8 b16 matrix held as a fragment (thread T: row T/4, columns 2(T%4)..+1)
// into the same layout, in registers (movmatrix).
__device__ __forceinline__ uint32_t movmatrix_trans(uint32_t x) {
  uint32_t y;
  asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;\n" : "=r"(y) : "r"(x));
  return y;
}

// A fragment of rows r0.., columns k0.. of a row-major shared tile X (stride in elements).
__device__ __forceinline__ void load_a(uint32_t a[4], const __nv_bfloat16* X, int stride, int r0,
                                       int k0) {
  const int lane = threadIdx.x & 31, m = lane >> 3, r = lane & 7;
  ldmatrix_x4(a, X + (r0 + (m & 1) * 8 + r) * stride + k0 + (m >> 1) * 8);
}

// B fragments of two adjacent n-tiles (n0, n0 + 8) with B[k][n] = Y[n][k0 + k] (Y row-major in
// shared memory: the "transposed" operand, e.g. K in S = Q·Kᵀ). b[0..1]: tile n0, b[2..3]: n0 + 8.
__device__ __forceinline__ void load_b_rows_x2(uint32_t b[4], const __nv_bfloat16* Y, int stride,
                                               int n0, int k0) {
  const int lane = threadIdx.x & 31, m = lane >> 3, r = lane & 7;
  ldmatrix_x4(b, Y + (n0 + (m >> 1) * 8 + r) * stride + k0 + (m & 1) * 8);
}

// B fragments of two adjacent n-tiles with B[k][n] = Z[k0 + k][n] (Z row-major in shared memory,
// e.g. V in O = P·V). b[0..1]: tile n0, b[2..3]: n0 + 8.
__device__ __forceinline__ void load_b_cols_x2(uint32_t b[4], const __nv_bfloat16* Z, int stride,
                                               int k0, int n0) {
  const int lane = threadIdx.x & 31, m = lane >> 3, r = lane & 7;
  ldmatrix_x4_trans(b, Z + (k0 + (m & 1) * 8 + r) * stride + n0 + (m >> 1) * 8);
}

// A fragment of one 16-wide k step from the C fragments of its two 8-column halves.
__device__ __forceinline__ void c_to_a(uint32_t a[4], const float c0[4], const float c1[4]) {
  a[0] = pack_bf16(c0[0], c0[1]);
  a[1] = pack_bf16(c0[2], c0[3]);
  a[2] = pack_bf16(c1[0], c1[1]);
  a[3] = pack_bf16(c1[2], c1[3]);
}

// Asynchronous copy of kBytes global → shared (cp.async), its commit and wait: 16 bytes bypass L1
// (.cg), 4 and 8 go through it (.ca: sizes below 16 must); both addresses kBytes-aligned.
template <int kBytes>
__device__ __forceinline__ void cp_async(void* smem, const void* gmem) {
  static_assert(kBytes == 4 || kBytes == 8 || kBytes == 16, "cp.async copies 4, 8 or 16 bytes");
  const uint32_t s = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  if constexpr (kBytes == 16) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(gmem));
  } else {
    asm volatile("cp.async.ca.shared.global [%0], [%1], %2;\n" ::"r"(s), "l"(gmem), "n"(kBytes));
  }
}
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::);
}
// Waits until at most N committed groups of this thread are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

// Max / sum over the four lanes of a quad (the lanes sharing one fragment row).
__device__ __forceinline__ float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
__device__ __forceinline__ float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

// Max / sum over the eight lanes of a C fragment column (the lanes sharing tq).
__device__ __forceinline__ float column_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 4));
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 8));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 16));
}
__device__ __forceinline__ float column_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 4);
  x += __shfl_xor_sync(0xffffffffu, x, 8);
  return x + __shfl_xor_sync(0xffffffffu, x, 16);
}

}  // namespace nsa::cuda
