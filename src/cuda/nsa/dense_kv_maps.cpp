// Host side of dense_kv_maps.h.
#include "dense_kv_maps.h"

#include "common/tma.h"

namespace nsa::cuda {

DenseKvMaps make_dense_kv_maps(const NsaParams& p, int key_rows) {
  DenseKvMaps m;
  const int cmp = dense_map_index(Branch::kCmp), win = dense_map_index(Branch::kWin);
  m.k[cmp] = make_group_rows_map(p.k_cmp_bf16, p.C, p.G, p.dk, key_rows);
  m.v[cmp] = make_group_rows_map(p.v_cmp_bf16, p.C, p.G, p.dv, key_rows);
  const int w = static_cast<int>(Branch::kWin);
  m.k[win] = make_group_rows_map(p.k[w], p.T, p.G, p.dk, key_rows);
  m.v[win] = make_group_rows_map(p.v[w], p.T, p.G, p.dv, key_rows);
  return m;
}

}  // namespace nsa::cuda
