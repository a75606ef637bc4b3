// Tokenizers for `nsa prepare` (and, later, generation): bytes or SentencePiece.
//
// bytes: vocab 256, token = byte value; byte 0 (NUL, never in normalised text) is the
// end-of-text token that separates documents.
// sentencepiece: a BPE vocabulary trained on the corpus (or an existing .model loaded); text is
// encoded line by line with an explicit newline piece, so decode(encode(text)) == text; the
// end-of-text token is the model's </s> (eos).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "text_corpus.h"

namespace nsa::data {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  virtual std::string name() const = 0;
  virtual int64_t vocab_size() const = 0;
  virtual uint32_t eot() const = 0;
  virtual std::vector<uint32_t> encode(const std::string& text) const = 0;
  virtual std::string decode(const std::vector<uint32_t>& ids) const = 0;
};

std::unique_ptr<Tokenizer> make_byte_tokenizer();
// Trains a BPE SentencePiece model on the documents, writes it to `model_path`, returns it.
std::unique_ptr<Tokenizer> train_sentencepiece(const std::vector<Document>& docs,
                                               int64_t vocab_size, const std::string& model_path);
// Loads an existing SentencePiece model; throws nsa::Error naming the file.
std::unique_ptr<Tokenizer> load_sentencepiece(const std::string& model_path);

}  // namespace nsa::data
