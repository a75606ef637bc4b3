// Byte and SentencePiece tokenizers (see tokenizer.h).
#include "tokenizer.h"

#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include <unordered_map>

#include "nsa/error.h"

namespace nsa::data {
namespace {

class ByteTokenizer : public Tokenizer {
 public:
  std::string name() const override { return "bytes"; }
  int64_t vocab_size() const override { return 256; }
  uint32_t eot() const override { return 0; }
  std::vector<uint32_t> encode(const std::string& text) const override {
    std::vector<uint32_t> ids;
    ids.reserve(text.size());
    for (char c : text) {
      if (c != '\0') ids.push_back(static_cast<unsigned char>(c));
    }
    return ids;
  }
  std::string decode(const std::vector<uint32_t>& ids) const override {
    std::string out;
    for (uint32_t id : ids) {
      if (id != 0 && id < 256) out.push_back(static_cast<char>(id));
    }
    return out;
  }
};

// The newline piece: a user-defined symbol, so it is one token and survives normalisation.
constexpr const char* kNewline = "\n";

class SentencePieceTokenizer : public Tokenizer {
 public:
  explicit SentencePieceTokenizer(std::unique_ptr<sentencepiece::SentencePieceProcessor> sp)
      : sp_(std::move(sp)), newline_(sp_->PieceToId(kNewline)) {
    NSA_CHECK(sp_->eos_id() >= 0, "SentencePiece model has no </s> (eos) piece for end of text");
    NSA_CHECK(newline_ != sp_->unk_id(),
              "SentencePiece model has no newline piece (train it with nsa prepare)");
  }
  std::string name() const override { return "sentencepiece"; }
  int64_t vocab_size() const override { return sp_->GetPieceSize(); }
  uint32_t eot() const override { return static_cast<uint32_t>(sp_->eos_id()); }
  std::vector<uint32_t> encode(const std::string& text) const override {
    std::vector<uint32_t> ids;
    size_t start = 0;
    while (start <= text.size()) {
      const size_t end = std::min(text.find('\n', start), text.size());
      std::vector<int> line;
      const auto status = sp_->Encode(text.substr(start, end - start), &line);
      NSA_CHECK(status.ok(), "SentencePiece encode failed: ", status.ToString());
      for (int id : line) ids.push_back(static_cast<uint32_t>(id));
      if (end == text.size()) break;
      ids.push_back(static_cast<uint32_t>(newline_));
      start = end + 1;
    }
    return ids;
  }
  std::string decode(const std::vector<uint32_t>& ids) const override {
    std::string out;
    std::vector<int> line;
    auto flush = [&] {
      std::string piece;
      const auto status = sp_->Decode(line, &piece);
      NSA_CHECK(status.ok(), "SentencePiece decode failed: ", status.ToString());
      out += piece;
      line.clear();
    };
    for (uint32_t id : ids) {
      if (static_cast<int>(id) == newline_) {
        flush();
        out += '\n';
      } else if (static_cast<int>(id) != sp_->eos_id()) {
        line.push_back(static_cast<int>(id));
      }
    }
    flush();
    return out;
  }

 private:
  std::unique_ptr<sentencepiece::SentencePieceProcessor> sp_;
  int newline_;
};

// Feeds the documents' non-empty lines to the trainer.
class LineIterator : public sentencepiece::SentenceIterator {
 public:
  explicit LineIterator(const std::vector<Document>& docs) : docs_(docs) { advance(); }
  bool done() const override { return doc_ >= docs_.size(); }
  void Next() override { advance(); }
  const std::string& value() const override { return line_; }
  sentencepiece::util::Status status() const override { return {}; }

 private:
  void advance() {
    while (doc_ < docs_.size()) {
      const std::string& text = docs_[doc_].text;
      if (pos_ > text.size()) {
        ++doc_, pos_ = 0;
        continue;
      }
      const size_t end = std::min(text.find('\n', pos_), text.size());
      line_ = text.substr(pos_, end - pos_);
      pos_ = end + 1;
      if (!line_.empty()) return;
    }
  }
  const std::vector<Document>& docs_;
  size_t doc_ = 0, pos_ = 0;
  std::string line_;
};

}  // namespace

std::unique_ptr<Tokenizer> make_byte_tokenizer() {
  return std::make_unique<ByteTokenizer>();
}

std::unique_ptr<Tokenizer> train_sentencepiece(const std::vector<Document>& docs,
                                               int64_t vocab_size, const std::string& model_path) {
  NSA_CHECK(vocab_size >= 64 && vocab_size <= 1000000, "--vocab-size ", vocab_size,
            " is out of range (64 .. 1000000)");
  std::string prefix = model_path;
  if (prefix.size() > 6 && prefix.substr(prefix.size() - 6) == ".model") {
    prefix.resize(prefix.size() - 6);
  }
  const std::unordered_map<std::string, std::string> args = {
      {"model_prefix", prefix},
      {"vocab_size", std::to_string(vocab_size)},
      {"model_type", "bpe"},
      {"character_coverage", "1.0"},
      {"byte_fallback", "true"},
      {"normalization_rule_name", "identity"},
      {"remove_extra_whitespaces", "false"},
      {"add_dummy_prefix", "false"},
      {"split_digits", "true"},
      {"max_sentence_length", "65536"},
      {"input_sentence_size", "2000000"},
      {"shuffle_input_sentence", "true"},
      {"user_defined_symbols", kNewline},
      {"unk_id", "0"},
      {"bos_id", "-1"},
      {"eos_id", "1"},
      {"pad_id", "-1"},
      {"num_threads", "2"},
      {"minloglevel", "1"},
  };
  LineIterator lines(docs);
  const auto status = sentencepiece::SentencePieceTrainer::Train(args, &lines);
  if (!status.ok()) {
    // SentencePiece's own words ("Internal: …trainer_interface.cc(…) Vocabulary size too
    // high (5000). Please set it to a value <= 340."), with what the user can change.
    const std::string why = status.ToString();
    const bool vocab = why.find("ocabulary size") != std::string::npos;
    throw Error(str("prepare: SentencePiece could not train a ", vocab_size,
                    "-token vocabulary on this text", vocab ? " (too large for it)" : "", ": ", why,
                    vocab ? " – pass a smaller --vocab-size, or more text" : ""));
  }
  return load_sentencepiece(prefix + ".model");
}

std::unique_ptr<Tokenizer> load_sentencepiece(const std::string& model_path) {
  auto sp = std::make_unique<sentencepiece::SentencePieceProcessor>();
  const auto status = sp->Load(model_path);
  NSA_CHECK(status.ok(), "cannot load SentencePiece model '", model_path, "': ", status.ToString());
  return std::make_unique<SentencePieceTokenizer>(std::move(sp));
}

}  // namespace nsa::data
