// The select family's launcher (packed_select_kernels.cu: max / min-plus without an index, float32 and packed
// 16-bit), called by packed_select_cuda.cpp. ATen-free.
#pragma once

#include <cstdint>

#include "cuda/contraction.h"
#include "cuda/packed_select_shape.h"
#if !defined(__CUDACC_RTC__)
#include "cuda/launch_status.h"
#endif

namespace semiring_ops {
namespace cuda {

template <class T>
struct PackedArgs {
  OperandField<T> a, b;  // a as a left field [p, i, k], b as a right field [p, k, j]
  float* out;            // contiguous (batch, rows, cols), fp32
  int64_t batch;
  int32_t rows, cols, depth, tiles_n;
  // whether a thread's staged run of a / b can be read as vectors: unit stride along the operand's faster
  // dimension, the pointer and the other strides multiples of the run (select_vector_ok)
  bool vec_a, vec_b;
};

// The vector reads' condition for a field (see PackedArgs): its faster dimension (outer when stride_outer <=
// stride_t, as the kernel chooses) has unit stride, and the base, the batch stride and the other stride are
// multiples of a thread's run (select_run<T>() elements: 16 bytes).
template <class T>
bool select_vector_ok(const OperandField<T>& f) {
  const bool outer_fastest = f.stride_outer <= f.stride_t;
  const int64_t fast = outer_fastest ? f.stride_outer : f.stride_t, slow = outer_fastest ? f.stride_t : f.stride_outer;
  const auto address = reinterpret_cast<uintptr_t>(f.ptr);
  constexpr int64_t run = select_run<T>();
  return fast == 1 && slow % run == 0 && f.stride_p % run == 0 && address % 16 == 0;
}

#if !defined(__CUDACC_RTC__)
// out[p, i, j] = max_k (min_k) a[p, i, k] + b[p, k, j], each the correctly rounded value in T, for T in
// {float, c10::Half, c10::BFloat16}, on sm_80+. Fills the shape part of args; needs B n m > 0 and k > 0.
template <class T, bool kIsMax>
LaunchStatus launch_packed_select(PackedArgs<T>& args, int64_t batch, int64_t rows, int64_t cols, int64_t depth,
                                  cudaStream_t stream);
#endif

}  // namespace cuda
}  // namespace semiring_ops
