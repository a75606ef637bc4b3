// llm.c-format token shards (see token_shard.h).
#include "token_shard.h"

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "nsa/error.h"

namespace nsa::io {

TokenShardInfo read_token_shard_info(const std::string& path) {
  NSA_CHECK(!std::filesystem::is_directory(path), "token shard '", path,
            "' is a folder, not a shard file");
  std::ifstream f(path, std::ios::binary);
  NSA_CHECK(f, "cannot open token shard '", path, "'");
  int32_t header[256] = {};
  f.read(reinterpret_cast<char*>(header), kShardHeaderBytes);
  NSA_CHECK(f.gcount() == kShardHeaderBytes, "token shard '", path, "' is ", f.gcount(),
            " bytes: shorter than the 1024-byte header (truncated, or not a token shard)");
  NSA_CHECK(header[0] == kShardMagic, "token shard '", path, "' has magic ", header[0],
            ", expected ", kShardMagic, " (not an llm.c-format shard; make one with nsa prepare)");
  NSA_CHECK(header[1] == 1 || header[1] == 2, "token shard '", path, "' has version ", header[1],
            "; supported: 1 (uint16 tokens) and 2 (uint32 tokens)");
  NSA_CHECK(header[2] >= 0, "token shard '", path, "' has a negative token count ", header[2]);
  const TokenShardInfo info{header[1], header[2]};
  const int64_t expected = kShardHeaderBytes + info.num_tokens * (info.version == 1 ? 2 : 4);
  const auto actual = static_cast<int64_t>(std::filesystem::file_size(path));
  NSA_CHECK(actual == expected, "token shard '", path, "' is ", actual,
            " bytes but its header promises ", info.num_tokens, " tokens (", expected,
            " bytes): the file is ",
            actual < expected ? "truncated" : "longer than its header says", "; re-create it");
  return info;
}

std::vector<uint32_t> read_token_shard(const std::string& path) {
  const TokenShardInfo info = read_token_shard_info(path);
  std::ifstream f(path, std::ios::binary);
  f.seekg(kShardHeaderBytes);
  std::vector<uint32_t> tokens(static_cast<size_t>(info.num_tokens));
  if (info.version == 2) {
    f.read(reinterpret_cast<char*>(tokens.data()), info.num_tokens * 4);
  } else {
    std::vector<uint16_t> narrow(tokens.size());
    f.read(reinterpret_cast<char*>(narrow.data()), info.num_tokens * 2);
    for (size_t i = 0; i < narrow.size(); ++i) tokens[i] = narrow[i];
  }
  NSA_CHECK(f, "reading the tokens of '", path, "' failed");
  return tokens;
}

void write_token_shard(const std::string& path, const std::vector<uint32_t>& tokens) {
  NSA_CHECK(tokens.size() <= 0x7fffffffu, "token shard '", path, "': ", tokens.size(),
            " tokens exceed the format's int32 count; split into several shards");
  bool narrow = true;
  for (uint32_t t : tokens) narrow = narrow && t <= 0xffffu;
  int32_t header[256] = {};
  header[0] = kShardMagic;
  header[1] = narrow ? 1 : 2;
  header[2] = static_cast<int32_t>(tokens.size());
  const std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    NSA_CHECK(f, "cannot write '", tmp, "'");
    f.write(reinterpret_cast<const char*>(header), kShardHeaderBytes);
    if (narrow) {
      std::vector<uint16_t> n(tokens.begin(), tokens.end());
      f.write(reinterpret_cast<const char*>(n.data()), static_cast<std::streamsize>(n.size() * 2));
    } else {
      f.write(reinterpret_cast<const char*>(tokens.data()),
              static_cast<std::streamsize>(tokens.size() * 4));
    }
    f.flush();
    NSA_CHECK(f, "writing '", tmp, "' failed (disk full?)");
  }
  NSA_CHECK(std::rename(tmp.c_str(), path.c_str()) == 0, "cannot rename '", tmp, "' to '", path,
            "'");
}

}  // namespace nsa::io
