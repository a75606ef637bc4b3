// The copy engine's boxes as the decode parts use them (common/tma.h make_row_box_map, tma.cuh
// tma_load_box_2d) against the CPU: a [rows, width] bf16 tensor of distinct values, boxes of 64
// columns with the 128-byte swizzle – which must land in decode_tile.cuh's key_piece order, with
// the phase of the destination's 128-byte line in its 1024 bytes – and plain boxes 72 columns wide
// (the padded value rows: columns past the width and rows past the tensor arrive as zeros), every
// element checked. And the encoder's argument checks, which name what is wrong.
#include <gtest/gtest.h>

#include <cuda_bf16.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "cuda/common/cuda_check.h"
#include "cuda/common/device_buffer.h"
#include "cuda/common/tma.cuh"
#include "cuda/common/tma.h"
#include "cuda/nsa/decode_tile.cuh"

namespace nsa::cuda {
namespace {

using bf16 = __nv_bfloat16;

// One CTA copies the box at (column, row) into shared memory `lines` 128-byte lines past a
// 1024-byte boundary, then writes the box's bytes out as they lie there.
__global__ void copy_box_kernel(const __grid_constant__ CUtensorMap map, int column, int row,
                                int elements, int lines, bf16* out) {
  extern __shared__ unsigned char smem_raw[];
  __shared__ uint64_t bar;
  const uint32_t base = static_cast<uint32_t>(__cvta_generic_to_shared(smem_raw));
  bf16* box = reinterpret_cast<bf16*>(smem_raw + (((base + 1023u) & ~1023u) - base) + 128 * lines);
  if (threadIdx.x == 0) {
    mbarrier_init_one(&bar);
    mbarrier_init_fence();
    mbarrier_expect_bytes(&bar, static_cast<uint32_t>(elements * sizeof(bf16)));
    tma_load_box_2d(box, &map, column, row, &bar);
  }
  __syncthreads();
  mbarrier_wait(&bar, 0);
  for (int i = threadIdx.x; i < elements; i += blockDim.x) out[i] = box[i];
}

constexpr int kRows = 200, kWidth = 128, kBoxRows = 128;

// Element (r, c) of the tensor: (1 + c/128)·2^(r − 100) – exact in bf16 (7 mantissa bits for
// c < 128, exponents −100 .. 99) and distinct, so an element in a wrong place cannot match.
float value_at(int r, int c) {
  return std::ldexp(1.0f + static_cast<float>(c) / 128.0f, r - 100);
}

class TmaBoxes : public ::testing::Test {
 protected:
  void SetUp() override {
    std::vector<bf16> host(kRows * kWidth);
    for (int r = 0; r < kRows; ++r) {
      for (int c = 0; c < kWidth; ++c) host[r * kWidth + c] = __float2bfloat16(value_at(r, c));
    }
    tensor_.upload(host.data(), host.size());
    expect_.resize(host.size());
    for (size_t i = 0; i < host.size(); ++i) expect_[i] = __bfloat162float(host[i]);
  }

  // The box's elements as they lie in shared memory.
  std::vector<float> copy(const CUtensorMap& map, int column, int row, int box_cols,
                          int lines = 0) {
    const int elements = box_cols * kBoxRows;
    DeviceBuffer<bf16> out(elements);
    const size_t smem = 1024 + 128 * lines + elements * sizeof(bf16);
    NSA_CUDA_CHECK(cudaFuncSetAttribute(
        copy_box_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
    copy_box_kernel<<<1, 128, smem>>>(map, column, row, elements, lines, out.get());
    NSA_CUDA_CHECK(cudaGetLastError());
    NSA_CUDA_CHECK(cudaDeviceSynchronize());
    const std::vector<bf16> host = out.download();
    std::vector<float> got(elements);
    for (int i = 0; i < elements; ++i) got[i] = __bfloat162float(host[i]);
    return got;
  }

  // The tensor's element, or 0 past its rows or width (the copy engine's fill).
  float source(int r, int c) const {
    return r < kRows && c < kWidth ? expect_[r * kWidth + c] : 0.0f;
  }

  DeviceBuffer<bf16> tensor_;
  std::vector<float> expect_;
};

// At every 128-byte line of the swizzle's 1024-byte period (carve_tile_aligned64 takes the next
// 128-byte boundary): the rows land XOR-ed with the phase the destination's address gives.
TEST_F(TmaBoxes, SwizzledKeyRowsLandInKeyPieceOrderAtEveryPhase) {
  const CUtensorMap map = make_row_box_map(tensor_.get(), kRows, kWidth, 64, kBoxRows, true);
  for (int phase = 0; phase < 8; ++phase) {
    // Group 1's columns (64 ..), rows 100 .. 227: the last 28 past the tensor.
    const std::vector<float> got = copy(map, 64, 100, 64, phase);
    int wrong = 0, wrong_unphased = 0;
    for (int r = 0; r < kBoxRows; ++r) {
      for (int j = 0; j < 64; ++j) {
        const float want = source(100 + r, 64 + j);
        wrong += got[8 * decode::key_piece(r, j / 8, 8, phase) + j % 8] == want ? 0 : 1;
        wrong_unphased += got[8 * decode::key_piece(r, j / 8, 8) + j % 8] == want ? 0 : 1;
      }
    }
    EXPECT_EQ(wrong, 0) << "of " << kBoxRows * 64 << " key elements, phase " << phase;
    // The phase matters: read without it, a shifted box is wrong (the check can fail).
    if (phase > 0) EXPECT_GT(wrong_unphased, 0) << "phase " << phase;
  }
}

TEST_F(TmaBoxes, PlainValueBoxesArePaddedRows) {
  const int vs = tile_stride(64);  // 72: a value row and its padding
  const CUtensorMap map = make_row_box_map(tensor_.get(), kRows, kWidth, vs, kBoxRows, false);
  for (const int column : {0, 64}) {  // group 0: its padding is group 1's first 8; group 1: zeros
    for (const int row : {0, 150}) {
      const std::vector<float> got = copy(map, column, row, vs);
      int wrong = 0;
      for (int r = 0; r < kBoxRows; ++r) {
        for (int j = 0; j < vs; ++j)
          wrong += got[r * vs + j] == source(row + r, column + j) ? 0 : 1;
      }
      EXPECT_EQ(wrong, 0) << "box at column " << column << ", row " << row;
    }
  }
}

TEST(TmaBoxArguments, BadShapesNameTheField) {
  DeviceBuffer<bf16> x(64 * 64);
  const auto message = [&](int64_t width, int box_cols, int box_rows, bool swizzle) {
    try {
      make_row_box_map(x.get(), 64, width, box_cols, box_rows, swizzle);
    } catch (const std::exception& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(message(60, 8, 8, false).find("width 60"), std::string::npos);
  EXPECT_NE(message(64, 72, 8, true).find("box columns 72"), std::string::npos);
  EXPECT_NE(message(64, 64, 300, false).find("box rows 300"), std::string::npos);
  EXPECT_EQ(message(64, 64, 64, true), "");
}

}  // namespace
}  // namespace nsa::cuda
