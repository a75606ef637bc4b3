// Documents from text files, directories and JSONL (see text_corpus.h).
#include "text_corpus.h"

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "nsa/error.h"

namespace nsa::data {
namespace fs = std::filesystem;

bool is_valid_utf8(const std::string& s) {
  const size_t n = s.size();
  size_t i = 0;
  while (i < n) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) {
      ++i;
      continue;
    }
    size_t len;
    uint32_t cp;
    if ((c & 0xe0) == 0xc0) {
      len = 2, cp = c & 0x1f;
    } else if ((c & 0xf0) == 0xe0) {
      len = 3, cp = c & 0x0f;
    } else if ((c & 0xf8) == 0xf0) {
      len = 4, cp = c & 0x07;
    } else {
      return false;
    }
    if (i + len > n) return false;
    for (size_t k = 1; k < len; ++k) {
      const auto cc = static_cast<unsigned char>(s[i + k]);
      if ((cc & 0xc0) != 0x80) return false;
      cp = (cp << 6) | (cc & 0x3f);
    }
    const bool overlong =
        (len == 2 && cp < 0x80) || (len == 3 && cp < 0x800) || (len == 4 && cp < 0x10000);
    if (overlong || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return false;
    i += len;
  }
  return true;
}

std::string latin1_to_utf8(const std::string& s) {
  std::string out;
  out.reserve(s.size() + s.size() / 8);
  for (char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    if (c < 0x80) {
      out.push_back(ch);
    } else {
      out.push_back(static_cast<char>(0xc0 | (c >> 6)));
      out.push_back(static_cast<char>(0x80 | (c & 0x3f)));
    }
  }
  return out;
}

std::string normalize_text(const std::string& raw) {
  const std::string utf8 = is_valid_utf8(raw) ? raw : latin1_to_utf8(raw);
  std::string out;
  out.reserve(utf8.size());
  for (size_t i = 0; i < utf8.size(); ++i) {
    const char c = utf8[i];
    if (c == '\0') continue;
    if (c == '\r') {
      out.push_back('\n');
      if (i + 1 < utf8.size() && utf8[i + 1] == '\n') ++i;
      continue;
    }
    out.push_back(c);
  }
  return out;
}

namespace {

std::string read_file(const fs::path& path) {
  std::ifstream f(path, std::ios::binary);
  NSA_CHECK(f, "cannot read '", path.string(), "'");
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

void load_file(const fs::path& path, std::vector<Document>& docs) {
  const std::string ext = path.extension().string();
  if (ext == ".jsonl") {
    std::ifstream f(path);
    NSA_CHECK(f, "cannot read '", path.string(), "'");
    std::string line;
    for (int64_t n = 1; std::getline(f, line); ++n) {
      if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
      nlohmann::json j;
      try {
        j = nlohmann::json::parse(line);
      } catch (const std::exception&) {
        throw Error(str("'", path.string(), "' line ", n, " is not valid JSON"));
      }
      NSA_CHECK(j.is_object() && j.contains("text") && j["text"].is_string(), "'", path.string(),
                "' line ", n, " has no string field \"text\"");
      docs.push_back({str(path.string(), ":", n), normalize_text(j["text"].get<std::string>())});
    }
    return;
  }
  docs.push_back({path.string(), normalize_text(read_file(path))});
}

}  // namespace

std::vector<Document> load_documents(const std::vector<std::string>& paths) {
  std::vector<Document> docs;
  for (const std::string& p : paths) {
    const fs::path path(p);
    NSA_CHECK(fs::exists(path), "input '", p, "' does not exist");
    if (fs::is_directory(path)) {
      std::vector<fs::path> files;
      for (const auto& e : fs::recursive_directory_iterator(path)) {
        const std::string ext = e.path().extension().string();
        if (e.is_regular_file() && (ext == ".txt" || ext == ".jsonl")) files.push_back(e.path());
      }
      std::sort(files.begin(), files.end());
      NSA_CHECK(!files.empty(), "input directory '", p, "' holds no .txt or .jsonl files");
      for (const auto& f : files) load_file(f, docs);
    } else {
      load_file(path, docs);
    }
  }
  return docs;
}

}  // namespace nsa::data
