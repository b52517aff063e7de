// semiring_ops::sequence_lengths for CPU tensors (contract in ops.h): one pass over each row of the mask and
// of the tags, problems or-ed into bits that sequence_host.h turns into errors.
#include <ATen/ATen.h>

#include <optional>

#include "ops.h"
#include "sequence_host.h"

namespace semiring_ops {

at::Tensor sequence_lengths(const std::optional<at::Tensor>& mask, const std::optional<at::Tensor>& lengths,
                            const std::optional<at::Tensor>& tags, int64_t batch, int64_t steps, int64_t num_tags) {
  check_sequence_args(mask, lengths, tags, batch, steps, num_tags);
  const at::Tensor* any = mask ? &*mask : lengths ? &*lengths : tags ? &*tags : nullptr;
  TORCH_CHECK(!any || any->device().is_cpu(), "sequence_lengths (CPU): got ", describe(*any));
  at::Tensor out = lengths ? lengths->to(at::kLong).contiguous() : at::full({batch}, steps, at::kLong);
  int64_t* L = out.data_ptr<int64_t>();
  int32_t bits = 0;
  if (mask) {
    const at::Tensor m = mask->to(at::kByte);
    const uint8_t* p = m.data_ptr<uint8_t>();
    const int64_t s0 = m.stride(0), s1 = m.stride(1);
    for (int64_t b = 0; b < batch; ++b) {
      int64_t count = 0;
      bool prev = true;
      for (int64_t t = 0; t < steps; ++t) {
        const bool on = p[b * s0 + t * s1] != 0;
        if (on && !prev) bits |= kMaskHoles;
        count += on;
        prev = on;
      }
      L[b] = count;
    }
  }
  for (int64_t b = 0; b < batch; ++b)
    if (L[b] < 0 || L[b] > steps) bits |= kLengthOutOfRange;
  if (tags && !bits) {
    const at::Tensor y = tags->to(at::kLong);
    const int64_t* p = y.data_ptr<int64_t>();
    const int64_t s0 = y.stride(0), s1 = y.stride(1);
    for (int64_t b = 0; b < batch; ++b)
      for (int64_t t = 0; t < L[b]; ++t) {
        const int64_t v = p[b * s0 + t * s1];
        if (v < 0 || v >= num_tags) bits |= kTagOutOfRange;
      }
  }
  raise_sequence_problems(bits, lengths, steps, num_tags);
  return out;
}

}  // namespace semiring_ops
