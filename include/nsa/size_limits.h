// Sizes that come from users (flags, config files, file headers, checkpoints) are bounded before
// anything is allocated: products are overflow-checked, and a size that is legal but more than
// this machine holds fails with "needs N GiB, limit M GiB" – never bad_alloc, a hang or a crash.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>

namespace nsa {

// The product of non-negative factors, or an nsa::Error "<what> overflows 64 bits".
int64_t checked_product(std::initializer_list<int64_t> factors, const std::string& what);

// The bytes one process may plan to hold: the machine's physical memory, or
// NSA_MEMORY_LIMIT_GIB when set (tests; a share of a bigger machine).
int64_t memory_limit_bytes();

// Throws "<what> needs N GiB, limit M GiB (...)" when bytes > memory_limit_bytes().
void check_memory(int64_t bytes, const std::string& what);

}  // namespace nsa
