// The host-side entry points that every backend (csrc/cpu, csrc/cuda) implements, with one meaning.
// Python (semiring_ops/ops) validates user input before calling these; the TORCH_CHECKs in the backends
// are a second line that turns any mistake into an exception instead of a crash.
#pragma once

#include <ATen/ATen.h>

#include <optional>
#include <vector>

namespace semiring_ops {

// Semiring batched matmul, forward.
//   a: (B, n, k), b: (B, k, m), one floating dtype (float16, bfloat16, float32, float64), one device;
//   any strides (a batch stride of 0 is a broadcast operand and is never copied B times).
//   semiring_id: the kId of a struct in semiring.h.
// Returns {out, arg}:
//   out (B, n, m), contiguous, in the accumulation dtype (float32 for 16-bit inputs, else the input's);
//   arg (B, n, m) int64, the k selected by max / min (lowest k on ties, first NaN wins), when with_arg
//   and the semiring selects; otherwise an empty int64 tensor.
// k = 0 gives the semiring's zero everywhere (and arg 0).
std::vector<at::Tensor> bmm_forward(const at::Tensor& a, const at::Tensor& b, int64_t semiring_id,
                                    bool with_arg);

// The log-weighted contraction that all log-semiring gradients are made of:
//   out[p, r, s] = sum_t L1[p, r, t] * R1[p, t, s] * exp(L0[p, r, t] + R0[p, t, s] + O0[p, r, s])
//   L0, L1: (B, R, T); R0, R1: (B, T, S); O0: (B, R, S); L1 and R1 optional (absent = 1).
//   One dtype, float32 or float64; any strides (batch stride 0 allowed). Returns (B, R, S) contiguous.
// T = 0 gives zeros.
at::Tensor log_contract(const at::Tensor& l0, const std::optional<at::Tensor>& l1, const at::Tensor& r0,
                        const std::optional<at::Tensor>& r1, const at::Tensor& o0);

}  // namespace semiring_ops
