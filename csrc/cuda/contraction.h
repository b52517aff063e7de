// The tile engine's kernel arguments (tile_engine.cuh), shared by the kernels and the host code that fills them
// (contraction_host.h): plain structs, no device code, no ATen.
//
// Every field is a pointer plus three int64 element strides (any strides; a batch stride of 0 is a broadcast).
#pragma once

#include <cstdint>
#include <limits>
#include <type_traits>

namespace semiring_ops {
namespace cuda {

// The accumulation type of an element type: float for float and the 16-bit types, double for double (what
// at::opmath_type gives, without its header).
template <class T> using acc_of_t = std::conditional_t<std::is_same_v<T, double>, double, float>;

// A left field [p, r, t] or right field [p, t, s], seen by the engine as (p, outer, t):
// outer = r for a left field, s for a right field.
template <class T>
struct OperandField {
  const T* ptr;
  int64_t stride_p, stride_outer, stride_t;
};

// The output-indexed field [p, r, s].
template <class T>
struct OutField {
  const T* ptr;
  int64_t stride_p, stride_r, stride_s;
};

// NL left fields, NR right fields, an output-indexed field and a policy's own Params (its outputs).
template <class T, int NL, int NR, class Params>
struct ContractionArgs {
  OperandField<T> left[NL];
  OperandField<T> right[NR];
  OutField<T> out_field;  // read only when the policy has kHasOutField
  int64_t batch;          // B
  int32_t rows, cols, depth;  // R, S, T (each < kMaxExtent, checked by the host)
  int32_t tiles_n;            // number of BN-wide column tiles
  Params params;
};

// Row / column / reduction extents stay far enough below 2^31 that int32 tile arithmetic
// (tile origin + in-tile offset) cannot overflow.
constexpr int64_t kMaxExtent = std::numeric_limits<int32_t>::max() - 4096;

}  // namespace cuda
}  // namespace semiring_ops
