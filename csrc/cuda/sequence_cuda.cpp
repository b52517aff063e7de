// semiring_ops::sequence_lengths for CUDA tensors (contract in ops.h): checks, the lengths' copy and the problem
// bits; the kernel is in sequence_kernels.cu (sequence_launch.h), which explains the marking.
#include <c10/cuda/CUDAGraphsC10Utils.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <optional>

#include "cuda/launch_check.h"
#include "cuda/sequence_launch.h"
#include "ops.h"
#include "sequence_host.h"

namespace semiring_ops {

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
  at::Tensor out = lengths ? any.new_empty({batch}, long_opts).copy_(*lengths)
                   : mask  ? any.new_empty({batch}, long_opts)
                           : any.new_full({batch}, steps, long_opts);
  if (batch == 0) return out;
  at::Tensor bits = mark ? at::Tensor() : any.new_zeros({1}, any.options().dtype(at::kInt));
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
  cuda::check_launch(cuda::launch_sequence_lengths(p, batch, c10::cuda::getCurrentCUDAStream()), "sequence_lengths (CUDA)");
  if (!mark) raise_sequence_problems(bits.item<int32_t>(), lengths, steps, num_tags);
  return out;
}

}  // namespace semiring_ops
