// Warp-level merges of the semiring accumulators (semiring.h), shared by the CUDA kernels.
#pragma once

#include <cstring>

namespace semiring_ops {
namespace cuda {

// Shuffles an accumulator (a few 32-bit words) across the lanes of a warp.
template <class Acc> __device__ __forceinline__ Acc shfl_xor(const Acc& a, int mask) {
  static_assert(sizeof(Acc) % 4 == 0, "accumulators are made of 32-bit words");
  unsigned words[sizeof(Acc) / 4];
  memcpy(words, &a, sizeof(Acc));
#pragma unroll
  for (int w = 0; w < int(sizeof(Acc) / 4); ++w) words[w] = __shfl_xor_sync(0xffffffffu, words[w], mask);
  Acc r;
  memcpy(&r, words, sizeof(Acc));
  return r;
}

// Every lane ends with the merge of the accumulators of its aligned group of kLanes lanes (a power of 2).
template <int kLanes, class Acc> __device__ __forceinline__ void lane_merge(Acc& a) {
#pragma unroll
  for (int mask = kLanes / 2; mask > 0; mask >>= 1) a.merge(shfl_xor(a, mask));
}

// Every lane ends with the merge of the warp's 32 accumulators.
template <class Acc> __device__ __forceinline__ void warp_merge(Acc& a) { lane_merge<32>(a); }

}  // namespace cuda
}  // namespace semiring_ops
