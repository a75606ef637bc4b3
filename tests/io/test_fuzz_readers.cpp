// Bounded random-mutation fuzzing of the two binary readers users feed files to: safetensors and
// token shards. Valid files are mutated (bytes flipped, digits of the JSON header changed, the
// file cut or grown) a fixed number of times from a fixed seed, so the test is reproducible and
// fast; every result must be a valid file or an nsa::Error – never another exception, a crash or
// (under the ASan build) a memory error.
#include <gtest/gtest.h>

#include <fstream>
#include <random>
#include <string>

#include "../common/test_util.h"
#include "io/safetensors.h"
#include "io/token_shard.h"

namespace nsa::test {
namespace {

constexpr int kIterations = 400;

std::string read_all(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

// One to four random edits; digits are favoured so that the JSON header stays parseable and the
// validation behind the parser is reached.
std::string mutate(std::string s, std::mt19937_64& rng) {
  const int edits = 1 + static_cast<int>(rng() % 4);
  for (int e = 0; e < edits && !s.empty(); ++e) {
    const size_t at = rng() % s.size();
    switch (rng() % 6) {
      case 0:
        s[at] = static_cast<char>(s[at] ^ (1 << (rng() % 8)));
        break;
      case 1:
        s[at] = static_cast<char>(rng());
        break;
      case 2:  // a digit of the header becomes another, or grows a number
        for (size_t i = at; i < s.size(); ++i) {
          if (s[i] >= '0' && s[i] <= '9') {
            if (rng() % 2) {
              s[i] = static_cast<char>('0' + rng() % 10);
            } else {
              s.insert(i, std::string(1 + rng() % 12, static_cast<char>('0' + rng() % 10)));
            }
            break;
          }
        }
        break;
      case 3:
        s.resize(at);
        break;
      case 4:
        s.insert(at, std::string(1 + rng() % 16, static_cast<char>(rng())));
        break;
      default:  // the 8-byte length word, or a shard header word
        s[rng() % std::min<size_t>(s.size(), 16)] = static_cast<char>(rng());
    }
  }
  return s;
}

template <typename Read>
void fuzz(const std::string& valid, const std::string& path, uint64_t seed, Read read) {
  std::mt19937_64 rng(seed);
  int accepted = 0, refused = 0;
  for (int i = 0; i < kIterations; ++i) {
    std::ofstream(path, std::ios::binary | std::ios::trunc) << mutate(valid, rng);
    try {
      read(path);
      ++accepted;
    } catch (const Error&) {
      ++refused;
    } catch (const std::exception& e) {
      FAIL() << "iteration " << i << ": not an nsa::Error: " << e.what();
    }
  }
  std::printf("%d mutated files: %d read, %d refused with an nsa::Error\n", kIterations, accepted,
              refused);
  EXPECT_GT(refused, 0);
}

TEST(FuzzReaders, Safetensors) {
  io::SafetensorsFile f;
  Tensor<float> a({3, 5}, 0.5f);
  Tensor<int32_t> b({7}, 3);
  f.put("a", a);
  f.put("b", b);
  f.put("c", io::StoredTensor{io::DType::kBF16, {2, 2}, std::vector<uint8_t>(8, 0x3f)});
  f.metadata = {{"l", "32"}, {"format", "pt"}};
  const std::string path = unique_temp_path("fuzz.safetensors");
  f.write(path);
  fuzz(read_all(path), path, 20261125, [](const std::string& p) {
    const io::SafetensorsFile r = io::SafetensorsFile::read(p);
    for (const std::string& name : r.names()) {
      const io::DType t = r.at(name).dtype;
      if (t == io::DType::kI32 || t == io::DType::kI64) {
        r.get_int(name);
      } else if (t != io::DType::kU8) {
        r.get_float(name);
      }
    }
  });
}

TEST(FuzzReaders, TokenShard) {
  const std::string path = unique_temp_path("fuzz.bin");
  std::vector<uint32_t> tokens(300);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<uint32_t>(i * 7 % 500);
  io::write_token_shard(path, tokens);
  fuzz(read_all(path), path, 7, [](const std::string& p) { io::read_token_shard(p); });
}

}  // namespace
}  // namespace nsa::test
