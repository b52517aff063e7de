// The host side of the tile engine's arguments (contraction.h): fields from tensors, and the extent checks the
// kernels rely on. ATen-facing: included by the *_cuda.cpp files only.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>

#include "cuda/contraction.h"

namespace semiring_ops {
namespace cuda {

// A field with neither of its last two strides in {0, 1} cannot be read coalesced in either loop
// order: copy it contiguous, keeping a broadcast (stride 0) batch a broadcast. Other tensors pass as-is.
// A copy may be freed as soon as the launch is queued: the caching allocator hands its memory only to work
// queued later on the same stream.
inline at::Tensor with_unit_inner_stride(const at::Tensor& t) {
  if (t.stride(1) <= 1 || t.stride(2) <= 1) return t;
  if (t.stride(0) == 0) return t.select(0, 0).contiguous().unsqueeze(0).expand(t.sizes());
  return t.contiguous();
}

// t is [p, r, t] (left) or [p, t, s] (right); pass tensors through with_unit_inner_stride first.
template <class T>
OperandField<T> left_field(const at::Tensor& t) {
  return {t.const_data_ptr<T>(), t.stride(0), t.stride(1), t.stride(2)};
}
template <class T>
OperandField<T> right_field(const at::Tensor& t) {
  return {t.const_data_ptr<T>(), t.stride(0), t.stride(2), t.stride(1)};
}
template <class T>
OutField<T> out_field(const at::Tensor& t) {
  return {t.const_data_ptr<T>(), t.stride(0), t.stride(1), t.stride(2)};
}

inline void check_extents(const char* who, int64_t rows, int64_t cols, int64_t depth) {
  TORCH_CHECK(rows <= kMaxExtent && cols <= kMaxExtent && depth <= kMaxExtent, who, ": dimensions must stay below ",
              kMaxExtent, ", got R=", rows, " S=", cols, " T=", depth);
}

}  // namespace cuda
}  // namespace semiring_ops
