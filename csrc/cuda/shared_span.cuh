// A place in shared memory, and the vector reads and scalar writes of the CUDA kernels through it.
//
// Why a type and not a pointer: NVRTC's front end keeps pointers into shared memory 64 bits wide, where nvcc's
// narrows them to the 32-bit shared window, and no NVRTC option narrows them. On the log forward that 64-bit offset
// arithmetic reached ptxas as another program, which it scheduled 2.4-3.1% slower (docs/perf_notes.md, "The NVRTC
// route's kernels"). So under NVRTC a SharedSpan is the 32-bit shared-window address, read and written with PTX's
// ld.shared / st.shared (volatile: kept in program order with the barriers around them), which took the NVRTC
// build of the log forward to within 1% of nvcc's. Under nvcc it stays the plain pointer, and the program is the
// one it always was (its SASS unchanged, instruction for instruction). `python benchmarks/build_routes.py --sass`
// compares the two builds' SASS.
#pragma once

#include <cstdint>
#include <type_traits>

namespace semiring_ops {
namespace cuda {
namespace detail {

#if defined(__CUDACC_RTC__)
template <class T>
struct SharedSpan {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>, "shared tiles hold float or double");
  static constexpr uint32_t kBytes = sizeof(T);
  uint32_t at;  // the shared-window address, in bytes

  struct Element {  // span[i] = x: one st.shared
    uint32_t at;
    __device__ __forceinline__ void operator=(T x) const {
      if constexpr (std::is_same_v<T, float>) {
        asm volatile("st.shared.f32 [%0], %1;" ::"r"(at), "f"(x) : "memory");
      } else {
        asm volatile("st.shared.f64 [%0], %1;" ::"r"(at), "d"(x) : "memory");
      }
    }
  };

  __device__ __forceinline__ SharedSpan operator+(int n) const { return {at + kBytes * static_cast<uint32_t>(n)}; }
  __device__ __forceinline__ Element operator[](int n) const { return {at + kBytes * static_cast<uint32_t>(n)}; }
};

template <class T>
__device__ __forceinline__ SharedSpan<T> shared_span(T* p) {
  return {static_cast<uint32_t>(__cvta_generic_to_shared(p))};
}
#define SEMIRING_OPS_SHARED_SPAN(array) ::semiring_ops::cuda::detail::shared_span(array)
#else
template <class T>
using SharedSpan = T*;  // nvcc's build: the pointer, and the program, as they always were
// (the array itself: passed through even an inlined function, it changes the program nvcc gives ptxas)
#define SEMIRING_OPS_SHARED_SPAN(array) (array)
#endif
// SEMIRING_OPS_SHARED_SPAN(array): the span at the first element of a __shared__ array.

// Reads N consecutive elements from src with the widest vector loads N allows. src must be aligned to the vector
// width (callers' pitches and offsets guarantee 16 bytes for whole rows of a micro-tile).
template <class T, int N>
__device__ __forceinline__ void load_shared_vec(T (&dst)[N], SharedSpan<T> src) {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>, "shared tiles hold float or double");
#if defined(__CUDACC_RTC__)
  const uint32_t a = src.at;
  if constexpr (std::is_same_v<T, float> && N % 4 == 0) {
#pragma unroll
    for (int v = 0; v < N / 4; ++v)
      asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];"
                   : "=f"(dst[4 * v]), "=f"(dst[4 * v + 1]), "=f"(dst[4 * v + 2]), "=f"(dst[4 * v + 3])
                   : "r"(a + 16u * v));
  } else if constexpr (std::is_same_v<T, float> && N % 2 == 0) {
#pragma unroll
    for (int v = 0; v < N / 2; ++v)
      asm volatile("ld.shared.v2.f32 {%0, %1}, [%2];" : "=f"(dst[2 * v]), "=f"(dst[2 * v + 1]) : "r"(a + 8u * v));
  } else if constexpr (std::is_same_v<T, float>) {
#pragma unroll
    for (int v = 0; v < N; ++v) asm volatile("ld.shared.f32 %0, [%1];" : "=f"(dst[v]) : "r"(a + 4u * v));
  } else if constexpr (N % 2 == 0) {
#pragma unroll
    for (int v = 0; v < N / 2; ++v)
      asm volatile("ld.shared.v2.f64 {%0, %1}, [%2];" : "=d"(dst[2 * v]), "=d"(dst[2 * v + 1]) : "r"(a + 16u * v));
  } else {
#pragma unroll
    for (int v = 0; v < N; ++v) asm volatile("ld.shared.f64 %0, [%1];" : "=d"(dst[v]) : "r"(a + 8u * v));
  }
#else
  const T* p = src;
  if constexpr (std::is_same_v<T, float> && N % 4 == 0) {
#pragma unroll
    for (int v = 0; v < N / 4; ++v) {
      const float4 x = reinterpret_cast<const float4*>(p)[v];
      dst[4 * v + 0] = x.x;
      dst[4 * v + 1] = x.y;
      dst[4 * v + 2] = x.z;
      dst[4 * v + 3] = x.w;
    }
  } else if constexpr (std::is_same_v<T, float> && N % 2 == 0) {
#pragma unroll
    for (int v = 0; v < N / 2; ++v) {
      const float2 x = reinterpret_cast<const float2*>(p)[v];
      dst[2 * v + 0] = x.x;
      dst[2 * v + 1] = x.y;
    }
  } else if constexpr (std::is_same_v<T, double> && N % 2 == 0) {
#pragma unroll
    for (int v = 0; v < N / 2; ++v) {
      const double2 x = reinterpret_cast<const double2*>(p)[v];
      dst[2 * v + 0] = x.x;
      dst[2 * v + 1] = x.y;
    }
  } else {
#pragma unroll
    for (int v = 0; v < N; ++v) dst[v] = p[v];
  }
#endif
}

}  // namespace detail
}  // namespace cuda
}  // namespace semiring_ops
