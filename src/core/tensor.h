// Tensor: a typed, contiguous, row-major view (pointer, dtype, shape, device) plus an
// optional shared owner that keeps the memory alive (an mmap, a host vector, a device
// allocation). Copying a Tensor copies the view, never the data.
#pragma once
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace moeserve {

enum class Device : uint8_t { CPU, CUDA };

using Shape = std::vector<int64_t>;

std::string shape_str(const Shape& s);  // "[2, 3]"
int64_t shape_numel(const Shape& s);

struct Tensor {
  void* data = nullptr;
  DType dtype = DType::F32;
  Shape shape;
  Device device = Device::CPU;
  std::shared_ptr<void> owner;  // keeps `data` alive; may be null for borrowed views

  bool defined() const { return data != nullptr; }
  bool empty() const { return data == nullptr; }
  int64_t numel() const { return shape_numel(shape); }
  size_t nbytes() const { return size_t(numel()) * dtype_size(dtype); }
  int64_t dim(int i) const { return shape.at(i < 0 ? shape.size() + i : i); }
  int rank() const { return int(shape.size()); }

  template <typename T> T* ptr() { return static_cast<T*>(data); }
  template <typename T> const T* ptr() const { return static_cast<const T*>(data); }

  // Allocates zeroed host memory.
  static Tensor host(DType t, Shape shape);
  // Borrowed view of existing memory (caller keeps it alive).
  static Tensor view(void* data, DType t, Shape shape, Device d = Device::CPU);

  // Rows [begin, end) of the leading dimension, sharing memory.
  Tensor slice_rows(int64_t begin, int64_t end) const;
  // Same memory, new shape with the same element count.
  Tensor reshaped(Shape s) const;
};

// Host f32 copy of any host tensor (exact conversion).
std::vector<float> to_f32_vector(const Tensor& t);

}  // namespace moeserve
