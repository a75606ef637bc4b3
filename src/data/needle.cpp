// The needle-retrieval task (see needle.h).
#include "needle.h"

#include <cmath>

#include "nsa/error.h"

namespace nsa {
namespace {

// splitmix64: a counter-based generator, so every sequence is a pure function of its seed.
uint64_t mix(uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

}  // namespace

NeedleSequence make_needle_sequence(int64_t length, double depth, int64_t vocab, uint64_t seed) {
  NSA_CHECK(vocab >= kNeedleMinVocab, "the needle task needs vocab_size >= ", kNeedleMinVocab,
            ", got ", vocab);
  NSA_CHECK(length >= kNeedleMinLength, "the needle task needs sequences of at least ",
            kNeedleMinLength, " tokens, got ", length);
  NSA_CHECK(depth <= 1.0, "needle depth ", depth, " is outside [0, 1]");
  uint64_t state = mix(seed);
  const auto next = [&state] { return state = mix(state); };
  const int64_t symbols = vocab - kNeedleFirstSymbol;
  NeedleSequence s;
  s.tokens.resize(static_cast<size_t>(length));
  const int64_t phase = static_cast<int64_t>(next() % kNeedleFillerPeriod);
  for (int64_t i = 0; i < length; ++i) {
    s.tokens[i] = kNeedleFillerFirst + static_cast<int32_t>((phase + i) % kNeedleFillerPeriod);
  }
  std::vector<int32_t> key(kNeedleKeyLen), value(kNeedleValueLen);
  for (auto& k : key) k = kNeedleFirstSymbol + static_cast<int32_t>(next() % symbols);
  for (auto& v : value) v = kNeedleFirstSymbol + static_cast<int32_t>(next() % symbols);
  // The question: kNeedleQuery, key, value – the last 1 + key + value tokens.
  const int64_t query_at = length - (1 + kNeedleKeyLen + kNeedleValueLen);
  const int64_t room = query_at - kNeedleSpan;  // latest start that ends before the query
  const double d = depth < 0 ? static_cast<double>(next() % 1000001) / 1e6 : depth;
  s.needle_at = static_cast<int64_t>(std::llround(d * static_cast<double>(room)));
  int64_t p = s.needle_at;
  s.tokens[p++] = kNeedleMark;
  for (int32_t k : key) s.tokens[p++] = k;
  for (int32_t v : value) s.tokens[p++] = v;
  p = query_at;
  s.tokens[p++] = kNeedleQuery;
  for (int32_t k : key) s.tokens[p++] = k;
  s.value_at = p;
  for (int32_t v : value) s.tokens[p++] = v;
  return s;
}

}  // namespace nsa
