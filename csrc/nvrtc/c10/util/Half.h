// NVRTC stand-in for c10/util/Half.h (csrc/nvrtc/README.md): c10::Half's layout (IEEE binary16 bits) and its
// conversions to and from float, through cuda_fp16.h. The kernels only load, convert and store it.
#pragma once

#include <cuda_fp16.h>

namespace c10 {
struct alignas(2) Half {
  unsigned short x;
  Half() = default;
  __host__ __device__ Half(float f) : x(__half_as_ushort(__float2half_rn(f))) {}
  __host__ __device__ operator float() const { return __half2float(__ushort_as_half(x)); }
};
}  // namespace c10
