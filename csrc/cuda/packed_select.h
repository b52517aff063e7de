// The packed 16-bit max-plus / min-plus kernel (packed_select_cuda.cu), called by bmm_forward when no
// argmax / argmin is asked for.
#pragma once

#include <ATen/ATen.h>

namespace semiring_ops {
namespace cuda {

// Whether a (B, n, k) x (B, k, m) product can take the packed path: float16 / bfloat16 on a device of compute
// capability 8.0 or newer, each batch entry's offsets within int32.
bool packed_select_supported(const at::Tensor& a, const at::Tensor& b);

// Whether the packed kernel beats the fp32 engine for a (B, n, k) x (B, k, m): supported, and its 128 x 128
// tiles fill the GPU (at least 2 blocks per SM; below that the engine's 64 x 64 tiles spread wider: H100,
// B = 8, n = 256: 0.093 ms packed, 0.053 ms fp32).
bool packed_select_pays(const at::Tensor& a, const at::Tensor& b);

// out (B, n, m), contiguous fp32, receives max_k (min_k) of a[p, i, k] + b[p, k, j], each value the
// correctly rounded 16-bit result (see packed_select_cuda.cu). a, b: same dtype and device, k >= 1.
void packed_select_bmm(const at::Tensor& a, const at::Tensor& b, at::Tensor& out, bool is_max);

}  // namespace cuda
}  // namespace semiring_ops
