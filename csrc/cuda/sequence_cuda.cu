// semiring_ops::sequence_lengths for CUDA tensors (contract in ops.h): one block per sequence counts its
// mask, looks for holes and checks its tags below the length; with raise_errors the problem bits come back
// to the host in one small copy (the only synchronisation), and sequence_host.h turns them into errors.
// Without raise_errors, and while the stream is being captured into a CUDA graph (no copy to the host can
// run), the kernel marks each bad sequence's length -1 instead (kInvalidLength), which the chain kernels
// turn into NaN scores (ops.h): no synchronisation at all.
#include <ATen/ATen.h>
#include <c10/cuda/CUDAGraphsC10Utils.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <optional>

#include "ops.h"
#include "sequence_host.h"

namespace semiring_ops {
namespace cuda {
namespace {

constexpr int kThreads = 256;

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

}  // namespace
}  // namespace cuda

at::Tensor sequence_lengths(const std::optional<at::Tensor>& mask, const std::optional<at::Tensor>& lengths,
                            const std::optional<at::Tensor>& tags, int64_t batch, int64_t steps, int64_t num_tags,
                            bool raise_errors) {
  check_sequence_args(mask, lengths, tags, batch, steps, num_tags);
  const at::Tensor& any = mask ? *mask : lengths ? *lengths : *tags;
  TORCH_CHECK(mask || lengths || tags, "sequence_lengths (CUDA): needs a mask, lengths or tags to find the device");
  TORCH_CHECK(any.is_cuda(), "sequence_lengths (CUDA): got ", describe(any));
  const c10::cuda::CUDAGuard guard(any.device());
  const auto long_opts = any.options().dtype(at::kLong);
  // marking: the problems stay on the device, in the lengths (a copy, never the caller's tensor)
  const bool capturing = c10::cuda::currentStreamCaptureStatusMayInitCtx() != c10::cuda::CaptureStatus::None;
  const bool mark = capturing || !raise_errors;
  // the kernel writes the lengths when it counts them from the mask, or marks them; given lengths are copied
  // (int64, contiguous) even when nothing is marked: an operator's output may not alias its input
  at::Tensor out = lengths ? at::empty({batch}, long_opts).copy_(*lengths)
                   : mask  ? at::empty({batch}, long_opts)
                           : at::full({batch}, steps, long_opts);
  if (batch == 0) return out;
  at::Tensor bits = mark ? at::Tensor() : at::zeros({1}, any.options().dtype(at::kInt));
  at::Tensor m = mask ? mask->view(at::kByte) : at::Tensor();
  at::Tensor y = tags ? tags->to(at::kLong) : at::Tensor();
  cuda::SequenceParams p{};
  if (mask) {
    p.has_mask = true;
    p.mask = m.data_ptr<uint8_t>();
    p.ms0 = m.stride(0);
    p.ms1 = m.stride(1);
  }
  if (tags) {
    p.tags = y.data_ptr<int64_t>();
    p.ts0 = y.stride(0);
    p.ts1 = y.stride(1);
  }
  p.lengths = out.data_ptr<int64_t>();
  p.bits = mark ? nullptr : bits.data_ptr<int32_t>();
  p.steps = steps;
  p.num_tags = num_tags;
  TORCH_CHECK(batch <= 0x7fffffff, "sequence_lengths (CUDA): at most 2^31 - 1 sequences, got ", batch);
  cuda::sequence_kernel<<<static_cast<unsigned>(batch), cuda::kThreads, 0, c10::cuda::getCurrentCUDAStream()>>>(p);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  if (!mark) raise_sequence_problems(bits.item<int32_t>(), lengths, steps, num_tags);
  return out;
}

}  // namespace semiring_ops
