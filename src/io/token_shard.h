// Token shards in the llm.c / nanoGPT binary format, so FineWeb shards prepared for llm.c load
// unchanged: 256 little-endian int32 header words – [0] magic 20240520, [1] version (1: uint16
// tokens, 2: uint32 tokens), [2] token count, the rest 0 – then the tokens.
//
// Readers validate the magic, the version and the file size against the count before returning
// anything, and every error names the file. Writers are atomic (temporary file, then rename).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace nsa::io {

constexpr int32_t kShardMagic = 20240520;
constexpr int64_t kShardHeaderBytes = 256 * 4;

struct TokenShardInfo {
  int32_t version;     // 1 = uint16 tokens, 2 = uint32 tokens
  int64_t num_tokens;  // tokens after the header
};

// Reads and validates only the header (and the file size).
TokenShardInfo read_token_shard_info(const std::string& path);
std::vector<uint32_t> read_token_shard(const std::string& path);
// Version 1 (uint16) when every token fits, else version 2.
void write_token_shard(const std::string& path, const std::vector<uint32_t>& tokens);

}  // namespace nsa::io
