// semiring_ops::condensed_scatter (contract in ops.h): a block of a symmetric (n, n) output, computed densely,
// written into the condensed vector of its pairs (scipy.spatial.distance.pdist's layout). Row i of the block
// holds consecutive entries of the condensed vector, so the block is one copy per row, rows in parallel:
// streaming stores for a block of at least kStreamMinBytes (stream_store.h, as stream_copy), else memcpy.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>

#include <algorithm>

#include "ops.h"
#include "stream_store.h"

namespace semiring_ops {

void condensed_scatter(at::Tensor& out, const at::Tensor& values, int64_t n, int64_t r0, int64_t c0,
                       bool diagonal) {
  TORCH_CHECK(out.device().is_cpu() && values.device().is_cpu(), "condensed_scatter: host tensors only, got out on ",
              out.device(), " and values on ", values.device());
  TORCH_CHECK(out.is_contiguous() && values.is_contiguous(), "condensed_scatter: out and values must be contiguous");
  TORCH_CHECK(out.scalar_type() == values.scalar_type(), "condensed_scatter: out is ", out.scalar_type(),
              " and values ", values.scalar_type());
  TORCH_CHECK(values.dim() >= 2, "condensed_scatter: values must be (rows, cols[, D]), got ", values.sizes());
  const int64_t rows = values.size(0), cols = values.size(1);
  const int64_t cell = values.numel() / std::max<int64_t>(rows * cols, 1) * values.element_size();  // D values
  const int64_t first = diagonal ? 0 : 1;  // row i's pairs start at column i + first
  const int64_t size = diagonal ? n * (n + 1) / 2 : n * (n - 1) / 2;
  TORCH_CHECK(n >= 0 && r0 >= 0 && c0 >= 0 && r0 + rows <= n && c0 + cols <= n,
              "condensed_scatter: block rows [", r0, ", ", r0 + rows, ") x cols [", c0, ", ", c0 + cols,
              ") outside n = ", n);
  TORCH_CHECK(out.numel() * out.element_size() == size * cell, "condensed_scatter: out holds ", out.numel(),
              " values; n = ", n, " needs ", size, " cells of ", cell / values.element_size(), " values");
  char* dst = static_cast<char*>(out.data_ptr());
  const char* src = static_cast<const char*>(values.data_ptr());
  const bool stream = kStreamingStores && values.numel() * values.element_size() >= kStreamMinBytes;
  // about 1 MiB of copies per task, so short rows are grouped
  const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 20) / std::max<int64_t>(cols * cell, 1));
  at::parallel_for(0, rows, grain, [&](int64_t begin, int64_t end) {
    for (int64_t li = begin; li < end; ++li) {
      const int64_t i = r0 + li;
      const int64_t j0 = std::max(c0, i + first);  // the row's first kept column
      if (j0 >= c0 + cols) continue;
      const int64_t row_start = diagonal ? n * i - i * (i - 1) / 2 : n * i - i * (i + 1) / 2;
      copy_run(dst + (row_start + j0 - i - first) * cell, src + (li * cols + (j0 - c0)) * cell,
               (c0 + cols - j0) * cell, stream);
    }
    if (stream) stream_fence();
  });
}

}  // namespace semiring_ops
