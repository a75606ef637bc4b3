// The needle-retrieval task (see needle.h).
#include "needle.h"

#include <algorithm>
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

void check_needle_args(int64_t length, int64_t vocab, int64_t needles) {
  NSA_CHECK(vocab >= kNeedleMinVocab, "the needle task needs vocab_size >= ", kNeedleMinVocab,
            ", got ", vocab);
  NSA_CHECK(needles >= 1 && needles <= kMaxNeedles, "needles per sequence must be in [1, ",
            kMaxNeedles, "], got ", needles);
  const int64_t min_len = needles == 1 ? kNeedleMinLength : 3 * needles * kNeedleSpan;
  NSA_CHECK(length >= min_len, "the needle task with ", needles,
            " needle(s) needs sequences of at least ", min_len, " tokens, got ", length);
}

// The filler cycle with a random phase, and one random key or value.
struct NeedleFill {
  uint64_t state;
  explicit NeedleFill(uint64_t seed) : state(mix(seed)) {}
  uint64_t next() { return state = mix(state); }
  void filler(std::vector<int32_t>& t, NeedleFiller kind, int64_t vocab) {
    if (kind == NeedleFiller::kRandom) {
      for (auto& x : t)
        x = kNeedleFirstSymbol + static_cast<int32_t>(next() % (vocab - kNeedleFirstSymbol));
      return;
    }
    const int64_t phase = static_cast<int64_t>(next() % kNeedleFillerPeriod);
    for (size_t i = 0; i < t.size(); ++i)
      t[i] = kNeedleFillerFirst +
             static_cast<int32_t>((phase + static_cast<int64_t>(i)) % kNeedleFillerPeriod);
  }
  std::vector<int32_t> symbols(int64_t n, int64_t vocab) {
    std::vector<int32_t> s(static_cast<size_t>(n));
    for (auto& x : s)
      x = kNeedleFirstSymbol + static_cast<int32_t>(next() % (vocab - kNeedleFirstSymbol));
    return s;
  }
};

// Writes marker, key, value at p; returns the position after them.
int64_t put_pair(std::vector<int32_t>& t, int64_t p, int32_t marker,
                 const std::vector<int32_t>& key, const std::vector<int32_t>& value) {
  t[p++] = marker;
  for (int32_t k : key) t[p++] = k;
  for (int32_t v : value) t[p++] = v;
  return p;
}

// An integer drawn log-uniformly from [lo, hi] (1 ≤ lo ≤ hi): one draw of `fill`, in a million
// steps.
int64_t log_uniform(NeedleFill& fill, int64_t lo, int64_t hi) {
  const double u = static_cast<double>(fill.next() % 1000001) / 1e6;
  const double x =
      static_cast<double>(lo) * std::pow(static_cast<double>(hi) / static_cast<double>(lo), u);
  return std::clamp<int64_t>(std::llround(x), lo, hi);
}

}  // namespace

NeedleFiller parse_needle_filler(const std::string& name, const std::string& what) {
  if (name == "cycle") return NeedleFiller::kCycle;
  if (name == "random") return NeedleFiller::kRandom;
  throw Error(what + ": unknown needle filler '" + name + "' (cycle or random)");
}

const char* needle_filler_name(NeedleFiller f) {
  return f == NeedleFiller::kRandom ? "random" : "cycle";
}

NeedleSequence make_needle_sequence(int64_t length, double depth, int64_t vocab, uint64_t seed,
                                    NeedleFiller filler) {
  check_needle_args(length, vocab, 1);
  NSA_CHECK(depth <= 1.0, "needle depth ", depth, " is outside [0, 1]");
  NeedleFill fill(seed);
  NeedleSequence s;
  s.tokens.resize(static_cast<size_t>(length));
  fill.filler(s.tokens, filler, vocab);
  const std::vector<int32_t> key = fill.symbols(kNeedleKeyLen, vocab);
  const std::vector<int32_t> value = fill.symbols(kNeedleValueLen, vocab);
  // The question: kNeedleQuery, key, value – the last 1 + key + value tokens.
  const int64_t query_at = length - kNeedleSpan;
  const int64_t room = query_at - kNeedleSpan;  // latest start that ends before the query
  double d = depth;
  if (depth < 0) {  // random: the two ends a quarter of the time each, else uniform
    const uint64_t pick = fill.next() % 4;
    d = pick == 0 ? 0.0 : pick == 1 ? 1.0 : static_cast<double>(fill.next() % 1000001) / 1e6;
  }
  s.needle_at = static_cast<int64_t>(std::llround(d * static_cast<double>(room)));
  put_pair(s.tokens, s.needle_at, kNeedleMark, key, value);
  s.value_at = query_at + 1 + kNeedleKeyLen;
  put_pair(s.tokens, query_at, kNeedleQuery, key, value);
  return s;
}

NeedleSequence make_multi_needle_sequence(int64_t length, int64_t needles, int64_t vocab,
                                          uint64_t seed, NeedleFiller filler) {
  check_needle_args(length, vocab, needles);
  if (needles == 1) return make_needle_sequence(length, -1.0, vocab, seed, filler);
  NeedleFill fill(seed);
  NeedleSequence s;
  s.tokens.resize(static_cast<size_t>(length));
  fill.filler(s.tokens, filler, vocab);
  std::vector<std::vector<int32_t>> keys, values;
  std::vector<int64_t> needle_at(static_cast<size_t>(needles));
  while (static_cast<int64_t>(keys.size()) < needles) {
    std::vector<int32_t> k = fill.symbols(kNeedleKeyLen, vocab);
    bool fresh = true;  // distinct keys: every question has one answer
    for (const auto& other : keys) fresh = fresh && other != k;
    if (!fresh) continue;
    keys.push_back(std::move(k));
    values.push_back(fill.symbols(kNeedleValueLen, vocab));
  }
  // 2n slots, one item each: a needle or the question for a needle opened earlier. Each slot
  // opens a needle or asks an open one (chosen uniformly), by a coin flip where both are possible,
  // so the distance from needle to question ranges from adjacent slots to the whole sequence.
  const int64_t slots = 2 * needles, stretch = length / slots;  // ≥ 1.5 spans (check_needle_args)
  std::vector<int64_t> open;
  int64_t opened = 0;
  for (int64_t i = 0; i < slots; ++i) {
    const int64_t at =
        i * stretch + static_cast<int64_t>(fill.next() % (stretch - kNeedleSpan + 1));
    const int64_t left = slots - i;
    const bool ask =
        opened == needles ||
        (!open.empty() && (left == static_cast<int64_t>(open.size()) || fill.next() % 2 == 0));
    if (!ask) {
      needle_at[opened] = at;
      put_pair(s.tokens, at, kNeedleMark, keys[opened], values[opened]);
      open.push_back(opened++);
      continue;
    }
    const size_t pick = fill.next() % open.size();
    const int64_t k = open[pick];
    open.erase(open.begin() + static_cast<int64_t>(pick));
    s.value_at = at + 1 + kNeedleKeyLen;
    s.needle_at = needle_at[k];
    put_pair(s.tokens, at, kNeedleQuery, keys[k], values[k]);
  }
  return s;
}

NeedleSequence make_short_needle_sequence(int64_t length, int64_t vocab, uint64_t seed,
                                          NeedleFiller filler) {
  check_needle_args(length, vocab, 1);
  NeedleFill fill(seed ^ 0x5ea7ed5e9e3779b9ull);  // the length and the tail: apart from the task
  const int64_t L =
      log_uniform(fill, std::min(length, std::max(kNeedleShortMin, kNeedleMinLength)), length);
  NeedleSequence s = make_needle_sequence(L, -1.0, vocab, seed, filler);
  std::vector<int32_t> tail(static_cast<size_t>(length - L));
  fill.filler(tail, filler, vocab);
  s.tokens.insert(s.tokens.end(), tail.begin(), tail.end());
  return s;
}

std::vector<int32_t> make_periodic_sequence(int64_t length, int64_t vocab, uint64_t seed) {
  check_needle_args(length, vocab, 1);
  NSA_CHECK(length >= 32, "periodic copy rows need at least 32 tokens, got ", length);
  NeedleFill fill(seed);
  const int64_t period = log_uniform(fill, 16, length / 2);
  std::vector<int32_t> t = fill.symbols(period, vocab);
  t.resize(static_cast<size_t>(length));
  for (int64_t i = period; i < length; ++i) t[i] = t[i - period];
  return t;
}

}  // namespace nsa
