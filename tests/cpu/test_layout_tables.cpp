// The arithmetic of the device-built layout tables (src/cuda/nsa/layout_tables.h, used by the C
// ABI's CUDA entry points) against NsaCudaLayer's host loops, on the CPU: for random packed layouts
// (empty and short sequences included) every table entry a device thread computes equals the host
// table's, padding entries are empty, and the capacities hold.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <random>
#include <vector>

#include "../../src/cuda/nsa/layout_tables.h"

namespace nsa::test {
namespace {

using layout::Tile;

struct HostTables {  // as NsaCudaLayer's constructor builds them
  std::vector<Tile> row_tiles, sel_units, cmp_units;
  std::vector<int64_t> cmp_raw_start, seq_of_row;
};

HostTables host_tables(const layout::Hyper& h, const std::vector<int64_t>& cu) {
  HostTables t;
  const int64_t rows = layout::kTileRows;
  for (size_t n = 0; n + 1 < cu.size(); ++n) {
    const int64_t start = cu[n], len = cu[n + 1] - cu[n];
    const int64_t seq = static_cast<int64_t>(n);
    for (int64_t r = 0; r < len; ++r) t.seq_of_row.push_back(seq);
    const int64_t nc = len < h.l ? 0 : (len - h.l) / h.d + 1;
    for (int64_t i = 0; i < nc; ++i) t.cmp_raw_start.push_back(start + i * h.d);
    for (int64_t r = 0; r < len; r += rows)
      t.row_tiles.push_back({seq, std::min(rows, len - r), r});
    for (int64_t b = 0; b < len; b += h.l_sel) {
      const int64_t block_end = std::min(len, b + h.l_sel);
      for (int64_t r = b; r < block_end; r += rows) {
        t.sel_units.push_back({seq, std::min(rows, block_end - r), r});
      }
    }
    for (int64_t i = 0; i < nc; i += rows) t.cmp_units.push_back({seq, std::min(rows, nc - i), i});
  }
  return t;
}

// Exclusive prefix sums of the per-sequence counts, [N + 1] each (what the device scan writes).
struct Offsets {
  std::vector<int64_t> tiles, sel_units, cmp_units, cmp, blocks;
};

Offsets offsets(const layout::Hyper& h, const std::vector<int64_t>& cu) {
  Offsets o;
  layout::SeqCounts run{};
  for (size_t n = 0; n < cu.size(); ++n) {
    o.tiles.push_back(run.row_tiles), o.sel_units.push_back(run.sel_units);
    o.cmp_units.push_back(run.cmp_units), o.cmp.push_back(run.cmp), o.blocks.push_back(run.blocks);
    if (n + 1 < cu.size()) run = run + layout::seq_counts(h, cu[n + 1] - cu[n]);
  }
  return o;
}

void expect_table(const std::vector<Tile>& host, int64_t cap,
                  const std::function<Tile(int64_t)>& entry, const char* what) {
  ASSERT_LE(static_cast<int64_t>(host.size()), cap) << what << ": capacity too small";
  for (int64_t i = 0; i < cap; ++i) {
    const Tile t = entry(i);
    if (i < static_cast<int64_t>(host.size())) {
      EXPECT_EQ(t.seq, host[i].seq) << what << "[" << i << "]";
      EXPECT_EQ(t.rows, host[i].rows) << what << "[" << i << "]";
      EXPECT_EQ(t.first, host[i].first) << what << "[" << i << "]";
    } else {
      EXPECT_EQ(t.rows, 0) << what << "[" << i << "] past the real count must be padding";
    }
  }
}

void check_layout(const layout::Hyper& h, const std::vector<int64_t>& cu) {
  const int64_t N = static_cast<int64_t>(cu.size()) - 1, T = cu.back();
  SCOPED_TRACE(::testing::Message()
               << "l=" << h.l << " d=" << h.d << " l_sel=" << h.l_sel << " N=" << N << " T=" << T);
  const HostTables host = host_tables(h, cu);
  const Offsets off = offsets(h, cu);
  const layout::Capacities caps = layout::capacities(h, T, N);
  EXPECT_EQ(off.blocks.back(), [&] {
    int64_t b = 0;
    for (int64_t n = 0; n < N; ++n) b += (cu[n + 1] - cu[n] + h.l_sel - 1) / h.l_sel;
    return b;
  }());
  EXPECT_LE(off.blocks.back(), caps.blocks);
  EXPECT_EQ(off.cmp.back(), static_cast<int64_t>(host.cmp_raw_start.size()));
  expect_table(
      host.row_tiles, caps.row_tiles,
      [&](int64_t i) { return layout::tile_entry(cu.data(), off.tiles.data(), N, i); },
      "row_tiles");
  expect_table(
      host.sel_units, caps.sel_units,
      [&](int64_t i) { return layout::sel_unit_entry(h, cu.data(), off.sel_units.data(), N, i); },
      "sel_units");
  expect_table(
      host.cmp_units, caps.cmp_units,
      [&](int64_t i) { return layout::tile_entry(off.cmp.data(), off.cmp_units.data(), N, i); },
      "cmp_units");
  ASSERT_LE(static_cast<int64_t>(host.cmp_raw_start.size()), caps.cmp);
  for (int64_t i = 0; i < caps.cmp; ++i) {
    const int64_t want =
        i < static_cast<int64_t>(host.cmp_raw_start.size()) ? host.cmp_raw_start[i] : -1;
    EXPECT_EQ(layout::cmp_raw_start_entry(h, cu.data(), off.cmp.data(), N, i), want) << i;
  }
  for (int64_t r = 0; r < T; ++r) {
    EXPECT_EQ(layout::seq_of_row_entry(cu.data(), N, r), host.seq_of_row[r]) << "row " << r;
  }
}

TEST(LayoutTables, DeviceEntriesMatchTheHostTables) {
  const layout::Hyper hypers[] = {{16, 8, 32},   {32, 16, 64},  {8, 4, 16}, {32, 16, 96},
                                  {32, 16, 128}, {16, 16, 256}, {4, 2, 4}};
  std::mt19937_64 rng(23);
  for (const layout::Hyper& h : hypers) {
    check_layout(h, {0, 1000});
    check_layout(h, {0, 0});
    check_layout(h, {0, 64, 128, 192});
    for (int trial = 0; trial < 40; ++trial) {
      const int64_t N = 1 + static_cast<int64_t>(rng() % 7);
      std::vector<int64_t> cu = {0};
      for (int64_t n = 0; n < N; ++n) {
        const int64_t kind = static_cast<int64_t>(rng() % 4);  // empty, short, medium, long
        const int64_t len = kind == 0   ? 0
                            : kind == 1 ? static_cast<int64_t>(rng() % (h.l + 2))
                            : kind == 2 ? static_cast<int64_t>(rng() % 300)
                                        : 300 + static_cast<int64_t>(rng() % 700);
        cu.push_back(cu.back() + len);
      }
      check_layout(h, cu);
    }
  }
}

// The worst cases of each capacity bound: many sequences just past a table's boundary.
TEST(LayoutTables, CapacitiesHoldAtTheirWorstCases) {
  for (const layout::Hyper& h : {layout::Hyper{32, 16, 64}, layout::Hyper{16, 16, 96}}) {
    for (int64_t len : {int64_t{1}, h.l, h.l + h.d, h.l_sel + 1, layout::kTileRows + 1,
                        h.l_sel + layout::kTileRows + 1}) {
      std::vector<int64_t> cu = {0};
      for (int n = 0; n < 9; ++n) cu.push_back(cu.back() + len);
      check_layout(h, cu);
    }
  }
}

TEST(LayoutTables, SanitizedCuSeqlensIsAValidLayout) {
  const auto sanitize = [](const std::vector<int64_t>& raw, int64_t T) {
    const int64_t N = static_cast<int64_t>(raw.size()) - 1;
    std::vector<int64_t> out;
    int64_t running = INT64_MIN;
    for (int64_t e = 0; e <= N; ++e) {
      out.push_back(layout::sanitized_cu_entry(raw[e], running, e, N, T));
      running = std::max(running, raw[e]);
    }
    return out;
  };
  EXPECT_EQ(sanitize({0, 5, 5, 9}, 9), (std::vector<int64_t>{0, 5, 5, 9}));  // valid: unchanged
  EXPECT_EQ(sanitize({3, 7, 2, 40, 1}, 9), (std::vector<int64_t>{0, 7, 7, 9, 9}));
  EXPECT_EQ(sanitize({-4, -1, 3}, 9), (std::vector<int64_t>{0, 0, 9}));
}

}  // namespace
}  // namespace nsa::test
