// The sequence-length kernel's launcher (sequence_kernels.cu), called by sequence_cuda.cpp. ATen-free.
#pragma once

#include <cstdint>
#if !defined(__CUDACC_RTC__)
#include "cuda/launch_status.h"
#endif

namespace semiring_ops {
namespace cuda {

struct SequenceParams {
  const uint8_t* mask;  // (B, T) (null when T = 0)
  bool has_mask;        // the lengths come from the mask (not from mask != null: a (B, 0) mask has no data)
  int64_t ms0, ms1;
  const int64_t* tags;  // (B, T) or null
  int64_t ts0, ts1;
  int64_t* lengths;  // (B,): given (checked) or written from the mask
  int32_t* bits;     // problems of the whole batch, for the host; null: mark each bad sequence's length -1
  int64_t steps, num_tags;
};

#if !defined(__CUDACC_RTC__)
// One block per sequence (batch < 2^31, checked by the host).
LaunchStatus launch_sequence_lengths(const SequenceParams& p, int64_t batch, cudaStream_t stream);
#endif

}  // namespace cuda
}  // namespace semiring_ops
