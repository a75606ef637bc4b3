// Data preparation: token shards (format, validation), text normalisation, document loading,
// tokenizers (round trips), and the prepare pipeline end to end on real text.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <functional>

#include "data/prepare.h"
#include "data/text_corpus.h"
#include "data/tokenizer.h"
#include "io/token_shard.h"
#include "nsa/error.h"
#include "train/token_loader.h"

namespace nsa::test {
namespace {
namespace fs = std::filesystem;

fs::path temp_dir(const std::string& name) {
  const fs::path p = fs::temp_directory_path() / ("nsa_test_" + name);
  fs::remove_all(p);
  fs::create_directories(p);
  return p;
}

void write(const fs::path& p, const std::string& bytes) {
  std::ofstream(p, std::ios::binary) << bytes;
}

void expect_error(const std::function<void()>& f, const std::string& fragment) {
  try {
    f();
    FAIL() << "no error; expected '" << fragment << "'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
  }
}

// A real-text sample: Alice from ../shared/data when present, otherwise a generated paragraph.
std::string sample_text() {
  for (const char* p : {"../shared/data/gutenberg/carroll-alice.txt",
                        "../../shared/data/gutenberg/carroll-alice.txt",
                        "../../../shared/data/gutenberg/carroll-alice.txt"}) {
    std::ifstream f(p, std::ios::binary);
    if (f) return data::normalize_text(std::string(std::istreambuf_iterator<char>(f), {}));
  }
  // Pseudo-words from a fixed generator: varied enough to train a 1000-piece vocabulary.
  const char* syllables[] = {"ka", "lo",  "ri",  "ten", "sha", "mu",  "ver", "do", "qui", "an",
                             "el", "por", "sti", "ne",  "ba",  "gru", "fa",  "ol", "zen", "wi"};
  uint64_t state = 12345;
  std::string s;
  for (int line = 0; line < 3000; ++line) {
    for (int word = 0; word < 9; ++word) {
      state = state * 6364136223846793005ull + 1442695040888963407ull;
      const int n = 1 + static_cast<int>((state >> 60) % 3);
      for (int k = 0; k < n; ++k) s += syllables[(state >> (8 * k + 16)) % 20];
      s += word == 8 ? ".\n" : " ";
    }
  }
  return s;
}

TEST(TokenShard, RoundTripsBothVersions) {
  const fs::path dir = temp_dir("shards");
  const std::vector<uint32_t> narrow = {0, 1, 65535, 7};
  const std::vector<uint32_t> wide = {0, 70000, 3};
  io::write_token_shard((dir / "a.bin").string(), narrow);
  io::write_token_shard((dir / "b.bin").string(), wide);
  EXPECT_EQ(io::read_token_shard_info((dir / "a.bin").string()).version, 1);
  EXPECT_EQ(io::read_token_shard_info((dir / "b.bin").string()).version, 2);
  EXPECT_EQ(io::read_token_shard((dir / "a.bin").string()), narrow);
  EXPECT_EQ(io::read_token_shard((dir / "b.bin").string()), wide);
  EXPECT_EQ(fs::file_size(dir / "a.bin"), 1024u + 8u);
}

TEST(TokenShard, RejectsDamageNamingTheFile) {
  const fs::path dir = temp_dir("bad_shards");
  const std::string good = (dir / "good.bin").string();
  io::write_token_shard(good, {1, 2, 3, 4});
  std::string bytes;
  {
    std::ifstream f(good, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(f), {});
  }
  write(dir / "short.bin", bytes.substr(0, 100));
  expect_error([&] { io::read_token_shard((dir / "short.bin").string()); },
               "shorter than the 1024-byte header");
  std::string magic = bytes;
  magic[0] = 'x';
  write(dir / "magic.bin", magic);
  expect_error([&] { io::read_token_shard((dir / "magic.bin").string()); }, "magic.bin' has magic");
  std::string version = bytes;
  version[4] = 9;
  write(dir / "version.bin", version);
  expect_error([&] { io::read_token_shard((dir / "version.bin").string()); }, "has version 9");
  write(dir / "trunc.bin", bytes.substr(0, bytes.size() - 2));
  expect_error([&] { io::read_token_shard((dir / "trunc.bin").string()); }, "truncated");
  write(dir / "long.bin", bytes + "xx");
  expect_error([&] { io::read_token_shard((dir / "long.bin").string()); },
               "longer than its header");
  expect_error([&] { io::read_token_shard((dir / "missing.bin").string()); },
               "cannot open token shard");
}

TEST(Text, NormalizesEncodingsAndLineEnds) {
  EXPECT_TRUE(data::is_valid_utf8("plain ascii"));
  EXPECT_TRUE(data::is_valid_utf8("caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80"));
  EXPECT_FALSE(data::is_valid_utf8("caf\xe9"));       // Latin-1 é
  EXPECT_FALSE(data::is_valid_utf8("\xc0\xaf"));      // overlong
  EXPECT_FALSE(data::is_valid_utf8("\xe2\x82"));      // truncated sequence
  EXPECT_FALSE(data::is_valid_utf8("\xed\xa0\x80"));  // surrogate
  EXPECT_EQ(data::normalize_text("caf\xe9\r\nline\rend"), "caf\xc3\xa9\nline\nend");
  EXPECT_EQ(data::normalize_text(std::string("a\0b", 3)), "ab");
}

TEST(Text, LoadsFilesDirectoriesAndJsonl) {
  const fs::path dir = temp_dir("docs");
  fs::create_directories(dir / "sub");
  write(dir / "b.txt", "second");
  write(dir / "sub" / "a.txt", "first\r\n");
  write(dir / "skip.md", "not text");
  write(dir / "c.jsonl", "{\"text\": \"third\"}\n\n{\"text\": \"fourth\", \"id\": 2}\n");
  const auto docs = data::load_documents({dir.string()});
  ASSERT_EQ(docs.size(), 4u);
  EXPECT_EQ(docs[0].text, "second");  // sorted paths: b.txt, c.jsonl, sub/a.txt
  EXPECT_EQ(docs[1].text, "third");
  EXPECT_EQ(docs[2].text, "fourth");
  EXPECT_EQ(docs[3].text, "first\n");
  write(dir / "bad.jsonl", "{\"text\": \"ok\"}\n{\"body\": \"no text\"}\n");
  expect_error([&] { data::load_documents({(dir / "bad.jsonl").string()}); },
               "bad.jsonl' line 2 has no string field \"text\"");
  expect_error([&] { data::load_documents({(dir / "nope").string()}); }, "does not exist");
}

TEST(Tokenizer, BytesRoundTrip) {
  const auto tok = data::make_byte_tokenizer();
  const std::string text = sample_text().substr(0, 5000);
  EXPECT_EQ(tok->decode(tok->encode(text)), text);
  EXPECT_EQ(tok->vocab_size(), 256);
  EXPECT_EQ(tok->eot(), 0u);
}

TEST(Tokenizer, SentencePieceTrainsAndRoundTripsNewlinesAndSpaces) {
  const fs::path dir = temp_dir("sp");
  const std::string text = sample_text();
  const auto tok = data::train_sentencepiece({{"sample", text}}, 1000, (dir / "t.model").string());
  EXPECT_EQ(tok->vocab_size(), 1000);
  const std::string probe = text.substr(0, 3000) + "\n\n  two spaces, and a tab\tend\n";
  const auto ids = tok->encode(probe);
  EXPECT_LT(ids.size(), probe.size() / 2) << "a trained vocabulary should compress text";
  EXPECT_EQ(tok->decode(ids), probe);
  for (uint32_t id : ids) ASSERT_LT(id, 1000u);
  const auto loaded = data::load_sentencepiece((dir / "t.model").string());
  EXPECT_EQ(loaded->encode(probe), ids);
  expect_error([&] { data::load_sentencepiece((dir / "missing.model").string()); },
               "cannot load SentencePiece model");
}

TEST(Prepare, WritesShardsWithDocumentSeparatorsAndSplit) {
  const fs::path in = temp_dir("prep_in"), out = temp_dir("prep_out");
  const std::string text = sample_text();
  write(in / "one.txt", text.substr(0, 20000));
  write(in / "two.txt", text.substr(20000, 10000));
  data::PrepareOptions o;
  o.inputs = {in.string()};
  o.out_dir = out.string();
  o.tokenizer = "bytes";
  o.val_fraction = 0.1;
  o.shard_tokens = 15000;
  const data::PrepareResult r = data::prepare_corpus(o);
  EXPECT_EQ(r.documents, 2);
  EXPECT_EQ(r.val_tokens, 2000 + 1 + 1000 + 1);
  EXPECT_EQ(r.train_tokens, 18000 + 1 + 9000 + 1);
  ASSERT_EQ(r.train_shards.size(), 2u);  // 27002 tokens at 15000 per shard
  std::vector<uint32_t> train;
  for (const auto& s : r.train_shards) {
    const auto part = io::read_token_shard(s);
    train.insert(train.end(), part.begin(), part.end());
  }
  ASSERT_EQ(static_cast<int64_t>(train.size()), r.train_tokens);
  EXPECT_EQ(train[18000], 0u) << "end-of-text after the first document";
  EXPECT_EQ(train.back(), 0u);
  EXPECT_TRUE(fs::exists(out / "meta.json"));
  // The loader reads the shards meta.json lists: a stray train_*.bin (another preparation's, a
  // copy) is not mixed in; without meta.json (an llm.c folder) every train_*.bin is read.
  fs::copy_file(r.train_shards[0], out / "train_999999.bin");
  EXPECT_EQ(TokenLoader(out.string(), "train", 256, 1).num_tokens(), r.train_tokens);
  fs::rename(out / "meta.json", out / "meta.json.away");
  EXPECT_EQ(TokenLoader(out.string(), "train", 256, 1).num_tokens(),
            r.train_tokens + 15000);  // the first shard twice
  fs::rename(out / "meta.json.away", out / "meta.json");
  fs::rename(out / "train_000001.bin", out / "moved.bin");
  expect_error([&] { TokenLoader(out.string(), "train", 256, 1); },
               "train_000001.bin', listed in '");
  fs::rename(out / "moved.bin", out / "train_000001.bin");
  fs::remove(out / "train_999999.bin");
  o.val_fraction = 0.9;
  expect_error([&] { data::prepare_corpus(o); }, "--val-fraction 0.9");
  o.val_fraction = 0.1;
  o.inputs.clear();
  expect_error([&] { data::prepare_corpus(o); }, "nothing to prepare");
  // An empty file is a document without text: an error, and no output folder.
  write(in / "empty.txt", "");
  o.inputs = {(in / "empty.txt").string()};
  o.out_dir = (out / "never").string();
  expect_error([&] { data::prepare_corpus(o); }, "the inputs hold no text (1 empty document(s))");
  EXPECT_FALSE(fs::exists(out / "never"));
}

}  // namespace
}  // namespace nsa::test
