// How a decoder splits the block top-n over CTAs (docs/inference.md, "Decoding on the GPU"): the
// candidate blocks of a (sequence, group) in chunks, one top-n CTA each, whose lists the picks CTAs
// merge; and where the picks CTAs go at most two an SM. Plain C++ (no CUDA headers) so that the
// CPU tests check the rules (tests/cpu/test_decode_chunks.cpp).
#pragma once

#include <cstdint>

#include "../common/host_device.h"

namespace nsa::cuda::decode {

constexpr int kTopkChunk = 64;      // candidate blocks a chunk, or a multiple of it
constexpr int kMaxTopkChunks = 32;  // block top-n chunks per (sequence, group): lists to rank
constexpr int kTopkCtasPerSm = 4;   // the top-n kernel's CTAs an SM (its launch bounds)

struct TopkChunks {
  int64_t chunk, chunks;  // blocks a chunk, chunks per (sequence, group)
};

// Candidate blocks per block top-n CTA of a decoder for max_len positions: kTopkChunk, or a
// multiple of it so that at most kMaxTopkChunks CTAs per (sequence, group) leave candidate lists
// for the picks CTAs to rank; `widen` times that. The candidates of position t are blocks
// 1 .. c − 2 (c = t / l_sel; 0, c − 1 and c are forced), so the last position, max_len − 1, has
// the most: a 64k decoder's 1,022 blocks take 16 chunks of 64 (not 17 with an empty one), a 128k
// decoder's 2,046 take 32 of 64 (not 17 of 128).
NSA_HOST_DEVICE constexpr TopkChunks topk_chunks(int64_t max_len, int64_t l_sel,
                                                 int64_t widen = 1) {
  const int64_t most = (max_len - 1) / l_sel - 2, candidates = most > 1 ? most : 1;
  const int64_t span = int64_t{kTopkChunk} * kMaxTopkChunks;
  const int64_t chunk = widen * kTopkChunk * ((candidates + span - 1) / span);
  return {chunk, (candidates + chunk - 1) / chunk};
}

// The top-n grid's rows per (sequence, group): a CTA a chunk, then a pre-merge CTA a head
// (nsa_decode.cu, topk_kernel).
NSA_HOST_DEVICE constexpr int64_t topk_grid_rows(int64_t chunks, int64_t hpg) {
  return chunks + hpg;
}

// The chunks a decoder of `rows` (sequence, group) pairs and hpg heads a group takes on `sms` SMs:
// topk_chunks, twice as long where there are more than half the lists a selection takes and the
// top-n grid – a CTA a chunk and a pre-merge CTA a head, per pair – would not fit in one wave
// (m7c_125m on 132 SMs: 128k from B = 7 on; 16 chunks of 128 instead of 32 of 64). Fewer waves
// and lists to merge, a longer ranking a chunk: 128k B8 attention 0.325 → 0.317 ms, B16 level
// (docs/perf.md, thirty-seventh session).
NSA_HOST_DEVICE constexpr TopkChunks decoder_topk_chunks(int64_t max_len, int64_t l_sel,
                                                         int64_t rows, int64_t hpg, int64_t sms) {
  const TopkChunks c = topk_chunks(max_len, l_sel);
  const bool waves = rows * topk_grid_rows(c.chunks, hpg) > kTopkCtasPerSm * sms;
  return c.chunks > kMaxTopkChunks / 2 && waves ? topk_chunks(max_len, l_sel, 2) : c;
}

// Whether the picks CTAs go at most two an SM (NsaDecodeCuda::spread_picks, which keeps it only if
// every cluster still fits at once): where their grid is more than the SMs and at most 1.5 times
// them – m7c on 132 SMs: B = 9 to 12. Measured on the H200: 64k B10 attention 0.250 → 0.235 ms,
// B12 0.273 → 0.268, 128k B10 0.360 → 0.353, B12 0.400 → 0.395; at B14 and B16, where two an SM
// leave few spare slots, 128k B14 lost 0.440 → 0.460 and B16 was level (docs/perf.md,
// thirty-eighth session).
NSA_HOST_DEVICE constexpr bool picks_spread_wanted(int64_t picks_ctas, int64_t sms) {
  return picks_ctas > sms && 2 * picks_ctas <= 3 * sms;
}

}  // namespace nsa::cuda::decode
