// Reading and writing safetensors files (the format PyTorch and Hugging Face tools load).
//
// Layout: u64 little-endian header length N, N bytes of JSON {name: {dtype, shape, data_offsets},
// "__metadata__": {string: string}}, then the data buffer. read() validates everything before any
// tensor is used: header length against file size, JSON syntax, known dtypes, shapes, offsets in
// range, byte counts equal to numel × dtype size, no overlap, buffer fully covered. Every error
// names the file and the tensor. write() is atomic and durable: a temporary file, every write
// checked, fsynced, renamed over the target.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "nsa/tensor.h"

namespace nsa::io {

enum class DType { kF32, kF64, kBF16, kF16, kI32, kI64, kU8 };
const char* dtype_name(DType dtype);  // safetensors spelling: "F32", "BF16", ...
int64_t dtype_size(DType dtype);

struct StoredTensor {
  DType dtype;
  Shape shape;
  std::vector<uint8_t> bytes;
};

class SafetensorsFile {
 public:
  static SafetensorsFile read(const std::string& path);
  // The same validation of the header against the file size, without reading the data: tensors
  // have their dtype and shape but no bytes (checking a file just written, listing a file).
  static SafetensorsFile read_header(const std::string& path);
  void write(const std::string& path) const;

  bool has(const std::string& name) const { return tensors_.count(name) > 0; }
  const StoredTensor& at(const std::string& name) const;
  std::vector<std::string> names() const;
  const std::string& path() const { return path_; }

  // Converts F32 / BF16 / F16 / F64 to float; throws for integer dtypes, naming the tensor.
  Tensor<float> get_float(const std::string& name) const;
  // Converts I32 / I64 to int64; throws for floating dtypes.
  std::vector<int64_t> get_int(const std::string& name) const;

  void put(const std::string& name, const Tensor<float>& t);
  void put(const std::string& name, const Tensor<int32_t>& t);
  void put(const std::string& name, StoredTensor t);  // any dtype, bytes as stored

  std::map<std::string, std::string> metadata;

 private:
  static SafetensorsFile read_impl(const std::string& path, bool with_data);
  std::map<std::string, StoredTensor> tensors_;
  std::string path_;
};

}  // namespace nsa::io
