// The packed 16-bit family's launcher (packed_select_kernels.cu), called by packed_select_cuda.cpp. ATen-free.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "cuda/contraction.h"
#include "cuda/launch_status.h"
#include "cuda/packed_select_shape.h"

namespace semiring_ops {
namespace cuda {

template <class T>
struct PackedArgs {
  OperandField<T> a, b;  // a as a left field [p, i, k], b as a right field [p, k, j]
  float* out;            // contiguous (batch, rows, cols), fp32
  int64_t batch;
  int32_t rows, cols, depth, tiles_n;
  float zero;  // the semiring's zero (-inf for max, +inf for min)
};

// out[p, i, j] = max_k (min_k) a[p, i, k] + b[p, k, j], each the correctly rounded 16-bit value, for T in
// {c10::Half, c10::BFloat16}, on sm_80+; every batch entry's offsets within int32 (the host checks). Fills the shape
// part of args; needs B n m > 0 and k > 0.
template <class T, bool kIsMax>
LaunchStatus launch_packed_select(PackedArgs<T>& args, int64_t batch, int64_t rows, int64_t cols, int64_t depth,
                                  cudaStream_t stream);

}  // namespace cuda
}  // namespace semiring_ops
