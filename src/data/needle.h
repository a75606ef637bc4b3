// The needle-retrieval task (docs/inference.md, "The needle task"): a key–value pair hidden at some
// depth of a long filler sequence; at the end the key is asked for and the model must produce the
// value. It shows whether sparse attention finds things far away: past the window w only the
// compressed and selected branches can see the needle.
//
// A sequence of length S (token ids; the vocabulary needs at least kNeedleMinVocab entries):
//   filler … [kNeedleMark k1..k4 v1..v4] … filler … [kNeedleQuery k1..k4 v1..v4]
// (associative recall: after the key again, the value that followed it – what an induction head
// does once it can see the needle).
// Two fillers: `cycle`, a fixed cycle of 16 tokens with a random phase (predictable, like the
// repeated sentences of passkey retrieval, so a trained model spends its loss on the value), and
// `random`, random symbols from the same range as keys and values (a haystack in which only the
// key itself tells the needle apart: nothing marks its compressed block as unusual). Keys and
// values are random tokens from the top of the vocabulary range [kNeedleFirstSymbol, vocab). The
// needle starts at round(depth · (S − 2·kNeedleSpan − 1)).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace nsa {

constexpr int32_t kNeedleMark = 1, kNeedleQuery = 2;
constexpr int32_t kNeedleFillerFirst = 4, kNeedleFillerPeriod = 16;
constexpr int32_t kNeedleFirstSymbol = kNeedleFillerFirst + kNeedleFillerPeriod;
constexpr int64_t kNeedleKeyLen = 4, kNeedleValueLen = 4;
constexpr int64_t kNeedleSpan = 1 + kNeedleKeyLen + kNeedleValueLen;  // mark, key, value
constexpr int64_t kNeedleMinVocab = kNeedleFirstSymbol + 16;
constexpr int64_t kNeedleMinLength = 3 * kNeedleSpan;

enum class NeedleFiller { kCycle, kRandom };
// "cycle" or "random"; anything else is an error naming `what` (the flag or option).
NeedleFiller parse_needle_filler(const std::string& name, const std::string& what);
const char* needle_filler_name(NeedleFiller f);

struct NeedleSequence {
  std::vector<int32_t> tokens;  // [S]
  int64_t needle_at = 0;        // position of kNeedleMark
  int64_t value_at = 0;  // position of the answer's first value token (S − kNeedleValueLen)
};

// depth in [0, 1], or < 0 for a random depth: 0 or 1 a quarter of the time each, else uniform.
// The ends are layouts that uniform depths almost never draw and that a model must still handle:
// the needle at position 0, in the forced first block where attention sinks usually form, and the
// needle just before its question, inside the window. Everything else comes from `seed`.
NeedleSequence make_needle_sequence(int64_t length, double depth, int64_t vocab, uint64_t seed,
                                    NeedleFiller filler = NeedleFiller::kCycle);
// n ≥ 1 needles at random depths (n = 1: make_needle_sequence(length, -1, vocab, seed, filler)).
NeedleSequence make_multi_needle_sequence(int64_t length, int64_t needles, int64_t vocab,
                                          uint64_t seed,
                                          NeedleFiller filler = NeedleFiller::kCycle);
constexpr int64_t kMaxNeedles = 64;

// A single-needle sequence of a random length L at the start of a longer row ("needle-short"): the
// first L tokens are make_needle_sequence(L, −1, vocab, seed, filler) – needle at a random depth
// of them, its question ending at L – and the rest is filler. L is drawn log-uniformly from
// [min(length, kNeedleShortMin), length], so a row of a long stage still holds the short lengths'
// layouts: a needle at position 0 asked a few thousand tokens later, as the evaluation at 4k asks
// it. needle_at and value_at are those of the first L tokens.
constexpr int64_t kNeedleShortMin = 1024;
NeedleSequence make_short_needle_sequence(int64_t length, int64_t vocab, uint64_t seed,
                                          NeedleFiller filler = NeedleFiller::kCycle);

// A copy row for training recall alongside needles ("needle-mix:N"): random symbols that repeat
// with a period P drawn log-uniformly from [16, length / 2] – every token after the first P is
// predictable by finding its earlier occurrence P back, near (inside the window) or far.
std::vector<int32_t> make_periodic_sequence(int64_t length, int64_t vocab, uint64_t seed);

}  // namespace nsa
