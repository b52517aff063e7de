// semiring_ops::sequence_lengths for CUDA tensors (contract in ops.h): one block per sequence counts its
// mask, looks for holes and checks its tags below the length; with raise_errors the problem bits come back
// to the host in one small copy (the only synchronisation), and sequence_host.h turns them into errors.
// Without raise_errors, and while the stream is being captured into a CUDA graph (no copy to the host can
// run), the kernel marks each bad sequence's length -1 instead (kInvalidLength), which the chain kernels
// turn into NaN scores (ops.h): no synchronisation at all.
#include <cstdint>

#include "cuda/kernel_ref.h"
#include "cuda/sequence_launch.h"
#include "sequence_problems.h"

namespace semiring_ops {
namespace cuda {
namespace sequence {  // named (not anonymous), so that NVRTC can name the kernel

constexpr int kThreads = 256;

#if SEMIRING_OPS_DEVICE_PASS
__global__ void __launch_bounds__(kThreads) sequence_kernel(SequenceParams p) {
  const int64_t b = blockIdx.x;
  int64_t L = p.has_mask ? 0 : p.lengths[b];  // with a mask, lengths is the output (not yet written)
  int problems = 0;
  if (p.has_mask) {
    int count = 0, holes = 0;
    for (int64_t t0 = 0; t0 < p.steps; t0 += kThreads) {
      const int64_t t = t0 + threadIdx.x;
      const bool on = t < p.steps && p.mask[b * p.ms0 + t * p.ms1] != 0;
      const bool prev_on = t == 0 || (t < p.steps && p.mask[b * p.ms0 + (t - 1) * p.ms1] != 0);
      count += __syncthreads_count(on);
      holes |= __syncthreads_or(on && !prev_on);
    }
    L = count;
    if (holes) problems |= kMaskHoles;
    if (threadIdx.x == 0) p.lengths[b] = L;
  }
  if (L < 0 || L > p.steps) problems |= kLengthOutOfRange;
  if (p.tags && !problems) {
    int bad = 0;
    for (int64_t t = threadIdx.x; t < L; t += kThreads) {
      const int64_t v = p.tags[b * p.ts0 + t * p.ts1];
      bad |= v < 0 || v >= p.num_tags;
    }
    if (__syncthreads_or(bad)) problems |= kTagOutOfRange;
  }
  if (threadIdx.x == 0 && problems) {
    if (p.bits) {
      atomicOr(p.bits, problems);
    } else {
      p.lengths[b] = kInvalidLength;
    }
  }
}

#endif  // SEMIRING_OPS_DEVICE_PASS
}  // namespace sequence

#if !defined(__CUDACC_RTC__)
LaunchStatus launch_sequence_lengths(const SequenceParams& p, int64_t batch, cudaStream_t stream) {
  const void* kernel = SEMIRING_OPS_KERNEL("cuda/sequence_kernels.cu", sequence::sequence_kernel);
  void* args[] = {const_cast<SequenceParams*>(&p)};
  SEMIRING_OPS_CUDA_TRY(
      cudaLaunchKernel(kernel, dim3(static_cast<unsigned>(batch)), dim3(sequence::kThreads), args, 0, stream));
  return last_launch();
}
#endif  // !__CUDACC_RTC__

}  // namespace cuda
}  // namespace semiring_ops
