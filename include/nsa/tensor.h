// A minimal owning, contiguous, row-major host tensor.
//
// The CPU reference needs nothing more than a shape and a buffer: no strides, no views, no
// autograd. Storage goes through TrackedAllocator so peak memory is measurable. Sizes are int64_t
// everywhere so packed batches of long sequences never overflow.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "nsa/error.h"
#include "nsa/memory_stats.h"

namespace nsa {

using Shape = std::vector<int64_t>;

inline int64_t shape_numel(const Shape& shape) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return n;
}

inline std::string shape_str(const Shape& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? "," : "") + std::to_string(shape[i]);
  return s + "]";
}

template <typename T>
struct Tensor {
  Shape shape;
  std::vector<T, TrackedAllocator<T>> data;

  Tensor() = default;
  explicit Tensor(Shape s, T fill = T(0)) : shape(std::move(s)), data(shape_numel(shape), fill) {}

  int64_t numel() const { return static_cast<int64_t>(data.size()); }
  bool empty() const { return data.empty() && shape.empty(); }
  int64_t dim(size_t i) const { return shape.at(i); }
  T* ptr() { return data.data(); }
  const T* ptr() const { return data.data(); }
  T& operator[](int64_t i) { return data[static_cast<size_t>(i)]; }
  const T& operator[](int64_t i) const { return data[static_cast<size_t>(i)]; }
  void fill(T value) { std::fill(data.begin(), data.end(), value); }

  // Converts element type (float <-> double), keeping the shape.
  template <typename U>
  Tensor<U> cast() const {
    Tensor<U> out(shape);
    for (int64_t i = 0; i < numel(); ++i) out[i] = static_cast<U>(data[static_cast<size_t>(i)]);
    return out;
  }
};

// Throws an nsa::Error naming `name` unless `t` has exactly `expected` as its shape.
template <typename T>
void check_shape(const Tensor<T>& t, const Shape& expected, const std::string& name) {
  NSA_CHECK(t.shape == expected, "tensor '", name, "' has shape ", shape_str(t.shape),
            ", expected ", shape_str(expected));
}

}  // namespace nsa
