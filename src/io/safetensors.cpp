// safetensors reader/writer with full validation (see safetensors.h).
#include "safetensors.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>

#include "durable_file.h"
#include "nsa/error.h"

namespace nsa::io {
namespace {

struct DTypeInfo {
  DType dtype;
  const char* name;
  int64_t size;
};
constexpr DTypeInfo kDTypes[] = {{DType::kF32, "F32", 4},   {DType::kF64, "F64", 8},
                                 {DType::kBF16, "BF16", 2}, {DType::kF16, "F16", 2},
                                 {DType::kI32, "I32", 4},   {DType::kI64, "I64", 8},
                                 {DType::kU8, "U8", 1}};

const DTypeInfo& info(DType dtype) {
  for (const auto& d : kDTypes) {
    if (d.dtype == dtype) return d;
  }
  throw Error("unknown dtype");
}

float half_to_float(uint16_t h) {
  const int sign = (h >> 15) & 1, exponent = (h >> 10) & 0x1f, mantissa = h & 0x3ff;
  float value;
  if (exponent == 0) {
    value = std::ldexp(static_cast<float>(mantissa), -24);
  } else if (exponent == 31) {
    value = mantissa ? NAN : INFINITY;
  } else {
    value = std::ldexp(static_cast<float>(mantissa | 0x400), exponent - 25);
  }
  return sign ? -value : value;
}

}  // namespace

const char* dtype_name(DType dtype) {
  return info(dtype).name;
}
int64_t dtype_size(DType dtype) {
  return info(dtype).size;
}

SafetensorsFile SafetensorsFile::read(const std::string& path) {
  return read_impl(path, true);
}

SafetensorsFile SafetensorsFile::read_header(const std::string& path) {
  return read_impl(path, false);
}

SafetensorsFile SafetensorsFile::read_impl(const std::string& path, bool with_data) {
  NSA_CHECK(!std::filesystem::is_directory(path), "safetensors file '", path,
            "' is a folder; pass a .safetensors file");
  std::ifstream file(path, std::ios::binary | std::ios::ate);
  NSA_CHECK(file, "cannot open safetensors file '", path, "'");
  const int64_t file_size = static_cast<int64_t>(file.tellg());
  file.seekg(0);
  NSA_CHECK(file_size >= 8, "safetensors file '", path, "' is ", file_size,
            " bytes: too short for the 8-byte header length (truncated or not safetensors)");
  uint64_t header_len = 0;
  unsigned char len_bytes[8];
  file.read(reinterpret_cast<char*>(len_bytes), 8);
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | len_bytes[i];
  NSA_CHECK(header_len <= static_cast<uint64_t>(file_size - 8), "safetensors file '", path,
            "': header length ", header_len, " exceeds the file size ", file_size,
            " (truncated or not safetensors)");
  std::string header(header_len, '\0');
  file.read(header.data(), static_cast<std::streamsize>(header_len));
  nlohmann::json json;
  try {
    json = nlohmann::json::parse(header);
  } catch (const std::exception& e) {
    throw Error(str("safetensors file '", path, "': header is not valid JSON (", e.what(), ")"));
  }
  NSA_CHECK(json.is_object(), "safetensors file '", path, "': header is not a JSON object");

  SafetensorsFile out;
  out.path_ = path;
  const int64_t data_size = file_size - 8 - static_cast<int64_t>(header_len);
  std::vector<std::pair<int64_t, int64_t>> spans;
  struct Pending {
    std::string name;
    int64_t begin, end;
  };
  std::vector<Pending> pending;
  for (const auto& [name, entry] : json.items()) {
    if (name == "__metadata__") {
      NSA_CHECK(entry.is_object(), "safetensors file '", path, "': __metadata__ is not an object");
      for (const auto& [key, value] : entry.items()) {
        NSA_CHECK(value.is_string(), "safetensors file '", path, "': __metadata__ value of '", key,
                  "' is not a string");
        out.metadata[key] = value.get<std::string>();
      }
      continue;
    }
    const std::string where = str("safetensors file '", path, "', tensor '", name, "'");
    NSA_CHECK(entry.is_object() && entry.contains("dtype") && entry.contains("shape") &&
                  entry.contains("data_offsets"),
              where, ": entry needs dtype, shape and data_offsets");
    NSA_CHECK(entry["dtype"].is_string(), where, ": dtype is not a string");
    const std::string dtype = entry["dtype"].get<std::string>();
    const DTypeInfo* dt = nullptr;
    for (const auto& d : kDTypes) {
      if (dtype == d.name) dt = &d;
    }
    NSA_CHECK(dt, where, ": dtype '", dtype,
              "' is not supported (F32, F64, BF16, F16, I32, I64, U8)");
    StoredTensor t;
    t.dtype = dt->dtype;
    NSA_CHECK(entry["shape"].is_array(), where, ": shape is not an array");
    for (const auto& s : entry["shape"]) {
      NSA_CHECK(s.is_number_integer() && s.get<int64_t>() >= 0, where,
                ": shape entries must be non-negative integers");
      t.shape.push_back(s.get<int64_t>());
    }
    int64_t bytes = dt->size;
    for (int64_t dim : t.shape) {
      NSA_CHECK(dim == 0 || bytes <= std::numeric_limits<int64_t>::max() / dim, where, ": shape ",
                shape_str(t.shape), " of ", dtype, " overflows a 64-bit byte count");
      bytes *= dim;
    }
    const auto& offs = entry["data_offsets"];
    NSA_CHECK(offs.is_array() && offs.size() == 2 && offs[0].is_number_integer() &&
                  offs[1].is_number_integer(),
              where, ": data_offsets must be [begin, end]");
    const int64_t begin = offs[0].get<int64_t>(), end = offs[1].get<int64_t>();
    NSA_CHECK(0 <= begin && begin <= end, where, ": data_offsets [", begin, ", ", end,
              "] are not ordered");
    NSA_CHECK(end <= data_size, where, ": data ends at byte ", end, " but the file holds only ",
              data_size, " data bytes (truncated file)");
    NSA_CHECK(end - begin == bytes, where, ": ", end - begin, " bytes do not match shape ",
              shape_str(t.shape), " of ", dtype);
    spans.emplace_back(begin, end);
    pending.push_back({name, begin, end});
    out.tensors_[name] = std::move(t);
  }
  std::sort(spans.begin(), spans.end());
  int64_t covered = 0;
  for (const auto& [begin, end] : spans) {
    NSA_CHECK(begin == covered, "safetensors file '", path,
              "': tensor data overlaps or leaves a gap at byte ", std::min(begin, covered));
    covered = end;
  }
  NSA_CHECK(covered == data_size, "safetensors file '", path, "': ", data_size - covered,
            " trailing bytes after the last tensor");
  if (!with_data) return out;
  std::vector<uint8_t> data(static_cast<size_t>(data_size));
  file.read(reinterpret_cast<char*>(data.data()), data_size);
  NSA_CHECK(file, "safetensors file '", path, "': read failed");
  for (const auto& p : pending) {
    out.tensors_[p.name].bytes.assign(data.begin() + p.begin, data.begin() + p.end);
  }
  return out;
}

void SafetensorsFile::write(const std::string& path) const {
  NSA_CHECK(!std::filesystem::is_directory(path), "cannot write safetensors file '", path,
            "': it is a folder; pass a file name");
  nlohmann::json json = nlohmann::json::object();
  if (!metadata.empty()) json["__metadata__"] = metadata;
  int64_t offset = 0;
  for (const auto& [name, t] : tensors_) {
    const int64_t n = static_cast<int64_t>(t.bytes.size());
    json[name] = {
        {"dtype", dtype_name(t.dtype)}, {"shape", t.shape}, {"data_offsets", {offset, offset + n}}};
    offset += n;
  }
  std::string header = json.dump();
  header.append((8 - header.size() % 8) % 8, ' ');  // align the data buffer to 8 bytes
  const std::string tmp = path + ".tmp";
  try {
    DurableFile file(tmp);
    uint64_t len = header.size();
    unsigned char len_bytes[8];
    for (int i = 0; i < 8; ++i) len_bytes[i] = static_cast<unsigned char>(len >> (8 * i));
    file.write(len_bytes, 8);
    file.write(header.data(), static_cast<int64_t>(header.size()));
    for (const auto& [name, t] : tensors_) {
      file.write(t.bytes.data(), static_cast<int64_t>(t.bytes.size()));
    }
    file.close();
    NSA_CHECK(std::rename(tmp.c_str(), path.c_str()) == 0, "cannot rename '", tmp, "' to '", path,
              "'");
  } catch (...) {
    std::remove(tmp.c_str());  // never leave a half-written temporary behind
    throw;
  }
}

const StoredTensor& SafetensorsFile::at(const std::string& name) const {
  auto it = tensors_.find(name);
  NSA_CHECK(it != tensors_.end(), "safetensors file '", path_, "' has no tensor '", name, "'");
  return it->second;
}

std::vector<std::string> SafetensorsFile::names() const {
  std::vector<std::string> out;
  for (const auto& [name, t] : tensors_) out.push_back(name);
  return out;
}

Tensor<float> SafetensorsFile::get_float(const std::string& name) const {
  const StoredTensor& t = at(name);
  Tensor<float> out(t.shape);
  const uint8_t* p = t.bytes.data();
  for (int64_t i = 0; i < out.numel(); ++i) {
    switch (t.dtype) {
      case DType::kF32:
        std::memcpy(&out[i], p + 4 * i, 4);
        break;
      case DType::kF64: {
        double v;
        std::memcpy(&v, p + 8 * i, 8);
        out[i] = static_cast<float>(v);
        break;
      }
      case DType::kBF16: {
        uint32_t bits = static_cast<uint32_t>(p[2 * i] | (p[2 * i + 1] << 8)) << 16;
        std::memcpy(&out[i], &bits, 4);
        break;
      }
      case DType::kF16:
        out[i] = half_to_float(static_cast<uint16_t>(p[2 * i] | (p[2 * i + 1] << 8)));
        break;
      default:
        throw Error(str("tensor '", name, "' in '", path_, "' has dtype ", dtype_name(t.dtype),
                        "; expected a floating dtype (F32, BF16, F16, F64)"));
    }
  }
  return out;
}

std::vector<int64_t> SafetensorsFile::get_int(const std::string& name) const {
  const StoredTensor& t = at(name);
  NSA_CHECK(t.dtype == DType::kI32 || t.dtype == DType::kI64, "tensor '", name, "' in '", path_,
            "' has dtype ", dtype_name(t.dtype), "; expected I32 or I64");
  std::vector<int64_t> out(static_cast<size_t>(shape_numel(t.shape)));
  for (size_t i = 0; i < out.size(); ++i) {
    if (t.dtype == DType::kI32) {
      int32_t v;
      std::memcpy(&v, t.bytes.data() + 4 * i, 4);
      out[i] = v;
    } else {
      std::memcpy(&out[i], t.bytes.data() + 8 * i, 8);
    }
  }
  return out;
}

void SafetensorsFile::put(const std::string& name, const Tensor<float>& t) {
  StoredTensor s{DType::kF32, t.shape, std::vector<uint8_t>(t.data.size() * 4)};
  std::memcpy(s.bytes.data(), t.ptr(), s.bytes.size());
  tensors_[name] = std::move(s);
}

void SafetensorsFile::put(const std::string& name, const Tensor<int32_t>& t) {
  StoredTensor s{DType::kI32, t.shape, std::vector<uint8_t>(t.data.size() * 4)};
  std::memcpy(s.bytes.data(), t.ptr(), s.bytes.size());
  tensors_[name] = std::move(s);
}

void SafetensorsFile::put(const std::string& name, StoredTensor t) {
  NSA_CHECK(static_cast<int64_t>(t.bytes.size()) == shape_numel(t.shape) * dtype_size(t.dtype),
            "tensor '", name, "': ", t.bytes.size(), " bytes do not match shape ",
            shape_str(t.shape), " of ", dtype_name(t.dtype));
  tensors_[name] = std::move(t);
}

}  // namespace nsa::io
