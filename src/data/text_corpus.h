// Raw text → documents, for `nsa prepare`.
//
// Inputs are files or directories (searched recursively, in sorted order): `*.txt` files are one
// document each, `*.jsonl` files hold one document per line in a "text" field. Text is normalised
// so every tokenizer sees clean UTF-8 with '\n' line ends: files that are not valid UTF-8 are read
// as Latin-1 (two Project Gutenberg books are), CRLF and lone CR become LF, NUL bytes are dropped.
#pragma once

#include <string>
#include <vector>

namespace nsa::data {

struct Document {
  std::string source;  // file (and line, for JSONL)
  std::string text;
};

bool is_valid_utf8(const std::string& s);
std::string latin1_to_utf8(const std::string& s);
// UTF-8 (or Latin-1 → UTF-8), CRLF/CR → LF, no NUL.
std::string normalize_text(const std::string& raw);

// Throws nsa::Error naming the path for a missing path, an unreadable file or a bad JSONL line.
std::vector<Document> load_documents(const std::vector<std::string>& paths);

}  // namespace nsa::data
