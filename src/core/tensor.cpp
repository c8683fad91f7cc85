#include "core/tensor.h"

#include <cstdlib>
#include <cstring>

#include "core/error.h"

namespace moeserve {

std::string shape_str(const Shape& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) {
    if (i) out += ", ";
    out += std::to_string(s[i]);
  }
  return out + "]";
}

int64_t shape_numel(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

Tensor Tensor::host(DType t, Shape shape) {
  Tensor x;
  x.dtype = t;
  x.shape = std::move(shape);
  size_t bytes = x.nbytes();
  // 64-byte alignment for vectorised CPU loops.
  void* p = std::aligned_alloc(64, ((bytes + 63) / 64) * 64 + 64);
  MS_CHECK(p, "out of host memory allocating {} bytes", bytes);
  std::memset(p, 0, bytes);
  x.owner = std::shared_ptr<void>(p, std::free);
  x.data = p;
  return x;
}

Tensor Tensor::view(void* data, DType t, Shape shape, Device d) {
  Tensor x;
  x.data = data;
  x.dtype = t;
  x.shape = std::move(shape);
  x.device = d;
  return x;
}

Tensor Tensor::slice_rows(int64_t begin, int64_t end) const {
  MS_CHECK(!shape.empty() && begin >= 0 && begin <= end && end <= shape[0],
           "slice_rows [{}, {}) out of range for shape {}", begin, end, shape_str(shape));
  Tensor x = *this;
  int64_t row = shape[0] ? numel() / shape[0] : 0;
  x.data = static_cast<char*>(data) + size_t(begin * row) * dtype_size(dtype);
  x.shape[0] = end - begin;
  return x;
}

Tensor Tensor::reshaped(Shape s) const {
  MS_CHECK(shape_numel(s) == numel(), "reshape {} -> {} changes the element count", shape_str(shape),
           shape_str(s));
  Tensor x = *this;
  x.shape = std::move(s);
  return x;
}

std::vector<float> to_f32_vector(const Tensor& t) {
  MS_CHECK(t.device == Device::CPU, "to_f32_vector needs a host tensor");
  std::vector<float> out(size_t(t.numel()));
  convert_to_f32(t.dtype, t.data, out.data(), out.size());
  return out;
}

}  // namespace moeserve
