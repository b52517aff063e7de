// The host side of sequence_lengths (contract in ops.h) that the backends share: argument checks, and the
// errors raised from the problem bits a backend's scan of the mask, lengths and tags reports.
#pragma once

#include "tensor_api.h"

#include <optional>
#include <string>

#include "checks.h"
#include "sequence_problems.h"

namespace semiring_ops {


// A shape as Python prints it: (2, 3).
inline std::string shape_tuple(const at::Tensor& t) {
  std::string out = "(";
  for (int64_t d = 0; d < t.dim(); ++d) out += (d ? ", " : "") + std::to_string(t.size(d));
  return out + (t.dim() == 1 ? ",)" : ")");
}

// The one tensor that gives the lengths (mask or lengths), checked; its dtype must be an integer or bool.
inline void check_sequence_args(const std::optional<at::Tensor>& mask, const std::optional<at::Tensor>& lengths,
                                const std::optional<at::Tensor>& tags, int64_t batch, int64_t steps,
                                int64_t num_tags) {
  TORCH_CHECK_VALUE(!(mask && lengths), "give mask or lengths, not both");
  TORCH_CHECK_VALUE(batch >= 0 && steps >= 0 && num_tags > 0, "sequence_lengths: bad sizes B=", batch, " T=", steps,
                    " C=", num_tags);
  if (mask) {
    TORCH_CHECK_VALUE(mask->dim() == 2 && mask->size(0) == batch && mask->size(1) == steps,
                      "mask has shape ", shape_tuple(*mask), "; expected (", batch, ", ", steps,
                      ") (batch-major) to match the inputs");
    TORCH_CHECK_VALUE(mask->scalar_type() == at::kBool || mask->scalar_type() == at::kByte,
                      "mask must be bool or uint8, got ", describe(*mask));
  }
  if (lengths)
    TORCH_CHECK_VALUE(lengths->dim() == 1 && lengths->size(0) == batch &&
                          at::isIntegralType(lengths->scalar_type(), /*includeBool=*/false),
                      "lengths must be an integer tensor of shape (", batch, ",), got ", describe(*lengths));
  if (tags)
    TORCH_CHECK_VALUE(tags->dim() == 2 && tags->size(0) == batch && tags->size(1) == steps &&
                          at::isIntegralType(tags->scalar_type(), /*includeBool=*/false),
                      "tags has shape ", shape_tuple(*tags), " and dtype ", tags->scalar_type(), "; expected an integer (",
                      batch, ", ", steps, ") tensor (batch-major)");
  const at::Tensor* first = mask ? &*mask : lengths ? &*lengths : tags ? &*tags : nullptr;
  for (const auto* t : {&mask, &lengths, &tags})
    if (*t && first)
      TORCH_CHECK_VALUE((*t)->device() == first->device(), "mask, lengths and tags must be on one device: got ",
                        describe(**t), " and ", describe(*first));
}

// Throws ValueError for the first problem in `bits`; `lengths` is read only then, for the message.
inline void raise_sequence_problems(int32_t bits, const std::optional<at::Tensor>& lengths, int64_t steps,
                                    int64_t num_tags) {
  TORCH_CHECK_VALUE(!(bits & kMaskHoles), "mask has holes (a 1 after a 0): only prefix masks (right padding) are supported");
  if (bits & kLengthOutOfRange) {
    TORCH_CHECK(lengths, "sequence_lengths: internal error: lengths out of range without given lengths");
    const at::Tensor shown = lengths->to(at::kCPU, at::kLong).contiguous();
    TORCH_CHECK_VALUE(false, "lengths must lie in 0..", steps, ", got ",
                      at::IntArrayRef(shown.data_ptr<int64_t>(), shown.numel()));
  }
  TORCH_CHECK_VALUE(!(bits & kTagOutOfRange), "tags must lie in [0, ", num_tags, ") at unmasked positions");
}

}  // namespace semiring_ops
