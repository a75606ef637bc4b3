// Host half of the TMA helpers (see tma.h): cuTensorMapEncodeTiled through
// cudaGetDriverEntryPointByVersion, looked up once.
#include "tma.h"

#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include <cstring>

#include "cuda_check.h"
#include "nsa/error.h"

namespace nsa::cuda {
namespace {

PFN_cuTensorMapEncodeTiled_v12000 encoder() {
  static const PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* ptr = nullptr;
    cudaDriverEntryPointQueryResult status{};
    NSA_CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &ptr, 12000,
                                                    cudaEnableDefault, &status));
    NSA_CHECK(status == cudaDriverEntryPointSuccess && ptr != nullptr,
              "TMA: the driver has no cuTensorMapEncodeTiled (a Hopper driver for CUDA 12+ is "
              "needed)");
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(ptr);
  }();
  return fn;
}

}  // namespace

CUtensorMap make_group_rows_map(const void* base, int64_t rows, int64_t G, int64_t D,
                                int box_rows) {
  CUtensorMap map;
  std::memset(&map, 0, sizeof(map));
  if (rows == 0 || base == nullptr) return map;
  NSA_CHECK(D % 64 == 0 && G > 0 && box_rows > 0 && box_rows <= 256, "TMA map: head dim ", D,
            " must be a multiple of 64 and box rows ", box_rows, " in [1, 256]");
  NSA_CHECK(reinterpret_cast<uintptr_t>(base) % 16 == 0,
            "TMA map: the K/V base address must be 16-byte aligned");
  const cuuint64_t dims[3] = {static_cast<cuuint64_t>(D), static_cast<cuuint64_t>(G),
                              static_cast<cuuint64_t>(rows)};
  const cuuint64_t strides[2] = {static_cast<cuuint64_t>(D * 2),
                                 static_cast<cuuint64_t>(G * D * 2)};
  const cuuint32_t box[3] = {64, 1, static_cast<cuuint32_t>(box_rows)};
  const cuuint32_t elem_strides[3] = {1, 1, 1};
  const CUresult r =
      encoder()(&map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 3, const_cast<void*>(base), dims, strides,
                box, elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  NSA_CHECK(r == CUDA_SUCCESS, "TMA map: cuTensorMapEncodeTiled failed (error ",
            static_cast<int>(r), ") for ", rows, " rows × ", G, " groups × ", D);
  return map;
}

CUtensorMap make_row_box_map(const void* base, int64_t rows, int64_t width, int box_cols,
                             int box_rows, bool swizzle_128b) {
  CUtensorMap map;
  std::memset(&map, 0, sizeof(map));
  if (rows == 0 || base == nullptr) return map;
  NSA_CHECK(width > 0 && width % 8 == 0 && box_cols > 0 && box_cols <= 256 && box_cols % 8 == 0 &&
                box_rows > 0 && box_rows <= 256 && (!swizzle_128b || box_cols == 64),
            "TMA map: width ", width, " must be a positive multiple of 8, box columns ", box_cols,
            " a multiple of 8 in [8, 256] (64 with the 128-byte swizzle) and box rows ", box_rows,
            " in [1, 256]");
  NSA_CHECK(reinterpret_cast<uintptr_t>(base) % 16 == 0,
            "TMA map: the base address must be 16-byte aligned");
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(width), static_cast<cuuint64_t>(rows)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(width * 2)};
  const cuuint32_t box[2] = {static_cast<cuuint32_t>(box_cols), static_cast<cuuint32_t>(box_rows)};
  const cuuint32_t elem_strides[2] = {1, 1};
  const CUresult r =
      encoder()(&map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, const_cast<void*>(base), dims, strides,
                box, elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
                swizzle_128b ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_NONE,
                CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  NSA_CHECK(r == CUDA_SUCCESS, "TMA map: cuTensorMapEncodeTiled failed (error ",
            static_cast<int>(r), ") for ", rows, " rows × ", width, ", box ", box_cols, " × ",
            box_rows);
  return map;
}

}  // namespace nsa::cuda
