// io/paths.h: paths compared as the file system sees them, and the --out folder that `train` and
// `prepare` make with one set of checks.
#include "io/paths.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "../common/test_util.h"
#include "nsa/error.h"

namespace nsa::test {
namespace {
namespace fs = std::filesystem;

TEST(Paths, SpellingsOfOneFolderAreOnePath) {
  const fs::path dir = unique_temp_path("paths_same");
  fs::create_directories(dir / "sub");
  EXPECT_EQ(io::normal_path(dir.string()), io::normal_path(dir.string() + "/"));
  EXPECT_EQ(io::normal_path(dir.string()), io::normal_path((dir / "sub" / "..").string()));
  EXPECT_EQ(io::normal_path((dir / "sub").string()), io::normal_path((dir / "." / "sub").string()));
  fs::remove_all(dir);
}

TEST(Paths, LiesWithinComparesWholeNames) {
  const fs::path dir = io::normal_path("/tmp/runs/x");
  EXPECT_TRUE(io::lies_within(io::normal_path("/tmp/runs/x"), dir));
  EXPECT_TRUE(io::lies_within(io::normal_path("/tmp/runs/x/ckpt_00000100"), dir));
  EXPECT_FALSE(io::lies_within(io::normal_path("/tmp/runs/xy"), dir));  // not a prefix of names
  EXPECT_FALSE(io::lies_within(io::normal_path("/tmp/runs"), dir));
}

TEST(Paths, MakeOutFolderCreatesOnceAndRefusesFilesAndEmptyNames) {
  const fs::path dir = fs::path(unique_temp_path("paths_out")) / "a" / "b";
  EXPECT_TRUE(io::make_out_folder(dir.string(), "--out", "a run folder"));  // with its parents
  EXPECT_TRUE(fs::is_directory(dir));
  EXPECT_FALSE(io::make_out_folder(dir.string(), "--out", "a run folder"));  // there already
  const fs::path file = dir / "a_file";
  std::ofstream(file) << "x";
  try {
    io::make_out_folder(file.string(), "--out", "a folder for the shards");
    FAIL() << "a file was taken as --out";
  } catch (const Error& e) {
    EXPECT_NE(
        std::string(e.what()).find("exists and is not a folder; pass a folder for the shards"),
        std::string::npos)
        << e.what();
  }
  try {
    io::make_out_folder("", "--dest", "a run folder");  // the error names the caller's flag
    FAIL() << "an empty folder name was taken";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--dest is empty; pass a run folder"), std::string::npos)
        << e.what();
  }
  fs::remove_all(dir.parent_path().parent_path());
}

}  // namespace
}  // namespace nsa::test
