// semiring_ops::sequence_lengths for CPU tensors (contract in ops.h): one pass over each row of the mask and
// of the tags; each sequence's problems are or-ed into bits that sequence_host.h turns into errors, or, without
// raise_errors, mark that sequence's length kInvalidLength.

#include <optional>

#include "ops.h"
#include "sequence_host.h"

namespace semiring_ops {

at::Tensor sequence_lengths(const std::optional<at::Tensor>& mask, const std::optional<at::Tensor>& lengths,
                            const std::optional<at::Tensor>& tags, int64_t batch, int64_t steps, int64_t num_tags,
                            bool raise_errors) {
  check_sequence_args(mask, lengths, tags, batch, steps, num_tags);
  TORCH_CHECK(mask || lengths || tags, "sequence_lengths (CPU): needs a mask, lengths or tags");
  const at::Tensor& any = mask ? *mask : lengths ? *lengths : *tags;
  TORCH_CHECK(any.device().is_cpu(), "sequence_lengths (CPU): got ", describe(any));
  // given lengths are copied (int64, contiguous): marking writes them, and an operator's output may not alias
  // its input, so never the caller's tensor
  const auto long_opts = any.options().dtype(at::kLong);
  at::Tensor out = lengths ? any.new_empty({batch}, long_opts).copy_(*lengths) : any.new_full({batch}, steps, long_opts);
  int64_t* L = out.data_ptr<int64_t>();
  const at::Tensor m = mask ? mask->to(at::kByte) : at::Tensor();
  const at::Tensor y = tags ? tags->to(at::kLong) : at::Tensor();
  int32_t bits = 0;
  for (int64_t b = 0; b < batch; ++b) {
    int32_t problems = 0;
    if (mask) {
      const uint8_t* row = m.data_ptr<uint8_t>() + b * m.stride(0);
      int64_t count = 0;
      bool prev = true;
      for (int64_t t = 0; t < steps; ++t) {
        const bool on = row[t * m.stride(1)] != 0;
        if (on && !prev) problems |= kMaskHoles;
        count += on;
        prev = on;
      }
      L[b] = count;
    }
    if (L[b] < 0 || L[b] > steps) problems |= kLengthOutOfRange;
    if (tags && !problems) {
      const int64_t* row = y.data_ptr<int64_t>() + b * y.stride(0);
      for (int64_t t = 0; t < L[b]; ++t) {
        const int64_t v = row[t * y.stride(1)];
        if (v < 0 || v >= num_tags) problems |= kTagOutOfRange;
      }
    }
    bits |= problems;
    if (problems && !raise_errors) L[b] = kInvalidLength;
  }
  if (raise_errors) raise_sequence_problems(bits, lengths, steps, num_tags);
  return out;
}

}  // namespace semiring_ops
