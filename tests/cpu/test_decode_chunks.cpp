// How the GPU decoder chunks its block top-n (src/cuda/nsa/decode_chunks.h), on the CPU: the
// chunk sizes of the documented contexts, the lists never more than a selection merges, every
// candidate block in a chunk, and chunks twice as long only where the top-n grid would not fit in
// one wave; the picks CTAs at most two an SM where their grid is 1 – 1.5 times the SMs.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>

#include "../../src/cuda/nsa/decode_chunks.h"

namespace nsa::test {
namespace {

using cuda::decode::decoder_topk_chunks;
using cuda::decode::kMaxTopkChunks;
using cuda::decode::kTopkChunk;
using cuda::decode::kTopkCtasPerSm;
using cuda::decode::picks_spread_wanted;
using cuda::decode::topk_chunks;
using cuda::decode::TopkChunks;

constexpr int64_t kSms = 132, kLsel = 64, kHpg = 6, kGroups = 2;  // m7c_125m on an H100 / H200

TEST(DecodeChunks, TheLastPositionsCandidatesFitTheChunks) {
  for (int64_t max_len : {1, 2, 64, 200, 4096, 65536, 65537, 131072, 530000, 1 << 21}) {
    for (int64_t widen : {1, 2}) {
      const TopkChunks c = topk_chunks(max_len, kLsel, widen);
      const int64_t candidates = std::max<int64_t>(1, (max_len - 1) / kLsel - 2);
      EXPECT_EQ(c.chunk % (kTopkChunk * widen), 0) << max_len;
      EXPECT_GE(c.chunks * c.chunk, candidates) << max_len;        // every candidate in a chunk
      EXPECT_LT((c.chunks - 1) * c.chunk, candidates) << max_len;  // no chunk empty
      EXPECT_LE(c.chunks, kMaxTopkChunks) << max_len;
    }
  }
  EXPECT_EQ(topk_chunks(65536, kLsel).chunk, 64);
  EXPECT_EQ(topk_chunks(65536, kLsel).chunks, 16);
  EXPECT_EQ(topk_chunks(131072, kLsel).chunks, 32);
  EXPECT_EQ(topk_chunks(530000, kLsel).chunk, 320);
}

TEST(DecodeChunks, LongerChunksOnlyWhereTheTopnGridSpansWaves) {
  const auto chunks = [](int64_t max_len, int64_t batch) {
    return decoder_topk_chunks(max_len, kLsel, batch * kGroups, kHpg, kSms);
  };
  // 64k: 16 chunks of 64 at every batch (no more than half the lists a selection merges).
  for (int64_t b : {1, 4, 16, 64}) EXPECT_EQ(chunks(65536, b).chunk, 64) << b;
  // 128k: 32 chunks of 64 while 2·B·(32 + 6) CTAs fit in one wave of 4 an SM, else 16 of 128.
  for (int64_t b = 1; b <= 16; ++b) {
    const bool one_wave = b * kGroups * (32 + kHpg) <= kTopkCtasPerSm * kSms;
    EXPECT_EQ(chunks(131072, b).chunk, one_wave ? 64 : 128) << b;
    EXPECT_EQ(chunks(131072, b).chunks, one_wave ? 32 : 16) << b;
  }
  EXPECT_EQ(chunks(131072, 6).chunk, 64);    // 456 CTAs
  EXPECT_EQ(chunks(131072, 7).chunk, 128);   // 532 > 528
  EXPECT_EQ(chunks(131072, 16).chunk, 128);  // 1,216
}

// m7c's picks grid is 8 CTAs a (sequence, group), two groups: on 132 SMs batches 9 to 12 (144 to
// 192 CTAs) spread, 8 (128: under a CTA an SM) and 13 (208: more than 1.5 times) do not.
TEST(DecodeChunks, PicksSpreadOnlyWhereTheirGridIsOneToOneAndAHalfTimesTheSms) {
  for (int64_t B = 1; B <= 32; ++B) {
    EXPECT_EQ(picks_spread_wanted(B * kGroups * 8, kSms), B >= 9 && B <= 12) << "B = " << B;
  }
  EXPECT_FALSE(picks_spread_wanted(kSms, kSms));
  EXPECT_TRUE(picks_spread_wanted(kSms + 1, kSms));
  EXPECT_TRUE(picks_spread_wanted(198, kSms));
  EXPECT_FALSE(picks_spread_wanted(199, kSms));
}

}  // namespace
}  // namespace nsa::test
