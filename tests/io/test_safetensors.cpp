// safetensors: round trip, BF16 reading, and one clear error per kind of damage.
#include <gtest/gtest.h>

#include <cstdio>

#include <filesystem>
#include <fstream>

#include "../common/test_util.h"
#include "io/safetensors.h"

namespace nsa::test {
namespace {

std::string temp_path(const std::string& name) {
  return unique_temp_path(name);
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

// A raw safetensors file from a header string and a data buffer.
std::string raw_file(const std::string& header, const std::string& data) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((header.size() >> (8 * i)) & 0xff);
  return out + header + data;
}

void expect_read_error(const std::string& bytes, const std::string& fragment) {
  const std::string path = temp_path("bad.safetensors");
  write_bytes(path, bytes);
  try {
    io::SafetensorsFile::read(path);
    FAIL() << "accepted a bad file; expected '" << fragment << "'";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(fragment), std::string::npos) << msg;
    EXPECT_NE(msg.find(path), std::string::npos) << "message does not name the file: " << msg;
  }
}

TEST(Safetensors, RoundTrip) {
  io::SafetensorsFile f;
  Tensor<float> a({2, 3});
  for (int64_t i = 0; i < 6; ++i) a[i] = 0.5f * static_cast<float>(i) - 1;
  Tensor<int32_t> b({4}, 7);
  b[3] = -1;
  f.put("a", a);
  f.put("b", b);
  f.metadata["l"] = "16";
  const std::string path = temp_path("roundtrip.safetensors");
  f.write(path);
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
  const auto g = io::SafetensorsFile::read(path);
  EXPECT_EQ(g.metadata.at("l"), "16");
  EXPECT_EQ(g.get_float("a").data, a.data);
  EXPECT_EQ(g.get_float("a").shape, a.shape);
  EXPECT_EQ(g.get_int("b"), (std::vector<int64_t>{7, 7, 7, -1}));
  EXPECT_THROW(g.get_float("b"), Error);
  EXPECT_THROW(g.at("c"), Error);
}

TEST(Safetensors, ReadsBf16) {
  // 1.0 = 0x3f80, -2.5 = 0xc020 in bfloat16, little-endian.
  const std::string data("\x80\x3f\x20\xc0", 4);
  const std::string path = temp_path("bf16.safetensors");
  write_bytes(path, raw_file(R"({"x":{"dtype":"BF16","shape":[2],"data_offsets":[0,4]}})", data));
  const auto f = io::SafetensorsFile::read(path);
  EXPECT_EQ(f.get_float("x").data, (std::vector<float, TrackedAllocator<float>>{1.0f, -2.5f}));
}

TEST(Safetensors, RejectsDamage) {
  const std::string ok_header = R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  const std::string data(8, '\0');
  expect_read_error("abc", "too short");
  expect_read_error(raw_file(ok_header, data).substr(0, 20), "exceeds the file size");
  expect_read_error(raw_file(ok_header, data.substr(0, 4)), "truncated file");
  expect_read_error(raw_file("{not json", data), "not valid JSON");
  expect_read_error(raw_file(R"({"x":{"dtype":"Q8","shape":[2],"data_offsets":[0,8]}})", data),
                    "dtype 'Q8' is not supported");
  expect_read_error(raw_file(R"({"x":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", data),
                    "do not match shape [3]");
  expect_read_error(raw_file(R"({"x":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", data),
                    "gap");
  expect_read_error(raw_file(ok_header, data + "xx"), "trailing bytes");
  expect_read_error(raw_file(R"({"x":{"dtype":"F32","shape":[2]}})", data),
                    "needs dtype, shape and data_offsets");
}

}  // namespace
}  // namespace nsa::test
