// What sequence_lengths reports about a batch of right-padded sequences (contract in ops.h), shared by the host code
// and the kernels (ATen-free): the length a bad sequence gets when it is not raised for, and the problem bits.
#pragma once

#include <cstdint>

namespace semiring_ops {

// The length sequence_lengths gives a bad sequence it does not raise for: without raise_errors, or under
// CUDA graph capture (see there and chain_scan).
constexpr int64_t kInvalidLength = -1;

// Problem bits, or-ed together by the backends' scans.
enum SequenceProblem : int32_t {
  kMaskHoles = 1,         // a 1 after a 0 in a row of the mask
  kLengthOutOfRange = 2,  // a length outside 0..T
  kTagOutOfRange = 4,     // a tag outside 0..num_tags-1 below its sequence's length
};

}  // namespace semiring_ops
