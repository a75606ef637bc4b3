// The arithmetic of the layout tables the NSA kernels take as their grids (RowTile tables, the
// compressed-token and selection-block offsets, each row's sequence), written once for the host
// and the device. NsaCudaLayer builds its tables on the host from a host cu_seqlens; the C ABI
// builds them on the device from a device cu_seqlens (device_layout.cu), without knowing the
// sequence lengths on the host, into tables of a capacity that holds for every cu_seqlens of T
// tokens in N sequences, padded with empty entries (rows = 0) that the kernels skip.
//
// Plain C++ (no CUDA headers) so that the CPU tests check it against NsaCudaLayer's loops
// (tests/cpu/test_layout_tables.cpp).
#pragma once

#include <cstdint>

#include "../common/host_device.h"

namespace nsa::layout {

// Rows of one query tile (kQueryTileRows) and of one dK/dV key unit (kDkdvUnitRows); the .cu
// files static_assert that they agree.
constexpr int64_t kTileRows = 64;

struct Hyper {
  int64_t l, d, l_sel;
};

// What one sequence of `len` tokens contributes to each table. A plain aggregate (SeqCounts{} is
// zero) because the device scan keeps it in shared memory.
struct SeqCounts {
  int64_t row_tiles;  // query tiles of kTileRows rows
  int64_t sel_units;  // key units of ≤ kTileRows rows inside one selection block
  int64_t cmp_units;  // units of ≤ kTileRows compressed tokens
  int64_t cmp;        // compressed tokens
  int64_t blocks;     // selection blocks (the last may be partial)
};

NSA_HOST_DEVICE SeqCounts operator+(const SeqCounts& a, const SeqCounts& b) {
  SeqCounts s;
  s.row_tiles = a.row_tiles + b.row_tiles, s.sel_units = a.sel_units + b.sel_units;
  s.cmp_units = a.cmp_units + b.cmp_units, s.cmp = a.cmp + b.cmp, s.blocks = a.blocks + b.blocks;
  return s;
}

NSA_HOST_DEVICE int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

NSA_HOST_DEVICE SeqCounts seq_counts(const Hyper& h, int64_t len) {
  SeqCounts c;
  c.row_tiles = ceil_div(len, kTileRows);
  c.cmp = len < h.l ? 0 : (len - h.l) / h.d + 1;
  c.cmp_units = ceil_div(c.cmp, kTileRows);
  c.blocks = ceil_div(len, h.l_sel);
  c.sel_units = len / h.l_sel * ceil_div(h.l_sel, kTileRows) + ceil_div(len % h.l_sel, kTileRows);
  return c;
}

// One table entry: `rows` rows (0: padding) from position `first` of sequence `seq`.
struct Tile {
  int64_t seq = 0, rows = 0, first = 0;
};

// The largest n in [0, N − 1] with off[n] <= i (off ascending, off[0] <= i): the sequence that
// owns entry i of a table whose per-sequence offsets are off. Sequences without entries
// (off[n] = off[n + 1]) are skipped because a later n with the same offset wins.
NSA_HOST_DEVICE int64_t owner(const int64_t* off, int64_t N, int64_t i) {
  int64_t lo = 0, hi = N - 1;
  while (lo < hi) {
    const int64_t mid = (lo + hi + 1) / 2;
    if (off[mid] <= i) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  return lo;
}

NSA_HOST_DEVICE int64_t min64(int64_t a, int64_t b) {
  return a < b ? a : b;
}

// Entry i of a table of 64-item tiles: tile k of a sequence covers its items [k·64, k·64 + 64).
// items_off: the sequences' item offsets (cu_seqlens for the query tiles, whose items are rows;
// cmp_offsets for the compressed branch's key units, whose items are compressed tokens);
// tile_off: the sequences' tile offsets in the table.
NSA_HOST_DEVICE Tile tile_entry(const int64_t* items_off, const int64_t* tile_off, int64_t N,
                                int64_t i) {
  Tile t;
  if (i >= tile_off[N]) return t;
  t.seq = owner(tile_off, N, i);
  t.first = (i - tile_off[t.seq]) * kTileRows;
  t.rows = min64(kTileRows, items_off[t.seq + 1] - items_off[t.seq] - t.first);
  return t;
}

// Entry i of the selected branch's key units: unit k of a sequence is part k % u of selection block
// k / u, u = ⌈l_sel / 64⌉ parts per block (the last block's parts stop at the sequence's end).
NSA_HOST_DEVICE Tile sel_unit_entry(const Hyper& h, const int64_t* cu, const int64_t* off,
                                    int64_t N, int64_t i) {
  Tile t;
  if (i >= off[N]) return t;
  t.seq = owner(off, N, i);
  const int64_t per_block = ceil_div(h.l_sel, kTileRows), k = i - off[t.seq];
  const int64_t block = k / per_block, len = cu[t.seq + 1] - cu[t.seq];
  t.first = block * h.l_sel + k % per_block * kTileRows;
  t.rows = min64(kTileRows, min64(len, (block + 1) * h.l_sel) - t.first);
  return t;
}

// First raw row (global) of compressed token i, or −1 for a padding token past the real count.
NSA_HOST_DEVICE int64_t cmp_raw_start_entry(const Hyper& h, const int64_t* cu,
                                            const int64_t* cmp_off, int64_t N, int64_t i) {
  if (i >= cmp_off[N]) return -1;
  const int64_t n = owner(cmp_off, N, i);
  return cu[n] + (i - cmp_off[n]) * h.d;
}

// The sequence of row i (i < cu[N]).
NSA_HOST_DEVICE int64_t seq_of_row_entry(const int64_t* cu, int64_t N, int64_t i) {
  return owner(cu, N, i);
}

// Entry e of a caller's cu_seqlens made into a valid layout of T tokens: 0 first, T last,
// non-decreasing in between (running maximum, clamped to [0, T]). A valid cu_seqlens is unchanged;
// an invalid one (which a device-side cu_seqlens cannot be checked for without a host
// synchronisation) gives some valid layout instead of out-of-bounds reads. `running_max` is the
// maximum of the raw entries before e.
NSA_HOST_DEVICE int64_t sanitized_cu_entry(int64_t raw, int64_t running_max, int64_t e, int64_t N,
                                           int64_t T) {
  if (e == 0) return 0;
  if (e == N) return T;
  const int64_t m = raw > running_max ? raw : running_max;
  return m < 0 ? 0 : (m > T ? T : m);
}

// Sizes of the tables for T tokens in N sequences, whatever the lengths: Σ ⌊(len − l)/d + 1⌋ ≤ T/d
// because d ≤ l; Σ ⌈len/l_sel⌉ ≤ (T + N(l_sel − 1))/l_sel; and a table of per-block or
// per-sequence ceilings of (rows/64) holds at most (rows + 63·parts)/64 entries.
struct Capacities {
  int64_t cmp, blocks, row_tiles, sel_units, cmp_units;
};

inline Capacities capacities(const Hyper& h, int64_t T, int64_t N) {
  Capacities c;
  c.cmp = T / h.d;
  c.blocks = (T + N * (h.l_sel - 1)) / h.l_sel;
  c.row_tiles = (T + N * (kTileRows - 1)) / kTileRows;
  c.sel_units = (T + c.blocks * (kTileRows - 1)) / kTileRows;
  c.cmp_units = (c.cmp + N * (kTileRows - 1)) / kTileRows;
  return c;
}

}  // namespace nsa::layout
