// semiring_ops::stream_copy (contract in ops.h): dst = src for a block of rows of a big host output, with
// streaming stores for large copies (stream_store.h). The copy is cut into pieces of src's bytes; threads take
// consecutive pieces (at::parallel_for), each piece one or more runs that end at dst's row ends.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>

#include <algorithm>
#include <cstdint>

#include "ops.h"
#include "stream_store.h"

namespace semiring_ops {
namespace {

constexpr int64_t kPieceBytes = int64_t{256} << 10;  // a 1 MiB copy runs on up to 4 threads

// Whether t is a block of rows: dims 1.. dense in row-major order (each t[i] contiguous), and rows that do not
// overlap (t.stride(0) at least a row's elements). A tensor of at most one dim must be contiguous; an empty one
// is a block of rows whatever its strides.
bool is_row_block(const at::Tensor& t) {
  if (t.numel() == 0) return true;
  if (t.dim() <= 1) return t.is_contiguous();
  int64_t expected = 1;
  for (int64_t k = t.dim() - 1; k >= 1; --k) {
    if (t.size(k) != 1 && t.stride(k) != expected) return false;
    expected *= t.size(k);
  }
  return t.size(0) <= 1 || t.stride(0) >= expected;
}

}  // namespace

void stream_copy(at::Tensor& dst, const at::Tensor& src) {
  TORCH_CHECK(dst.device().is_cpu() && src.device().is_cpu(), "stream_copy: host tensors only, got dst on ",
              dst.device(), " and src on ", src.device());
  TORCH_CHECK(dst.scalar_type() == src.scalar_type(), "stream_copy: dst is ", dst.scalar_type(), " and src ",
              src.scalar_type(), "; they must have one dtype");
  TORCH_CHECK(dst.sizes() == src.sizes(), "stream_copy: dst has shape ", dst.sizes(), " and src ", src.sizes(),
              "; they must have one shape");
  TORCH_CHECK(src.is_contiguous(), "stream_copy: src must be contiguous, got shape ", src.sizes(), " strides ",
              src.strides());
  TORCH_CHECK(is_row_block(dst), "stream_copy: dst must be a block of rows (each dst[i] contiguous, rows not ",
              "overlapping; a tensor of at most one dim contiguous), got shape ", dst.sizes(), " strides ",
              dst.strides(), "; dst.copy_(src) copies any layout");
  const int64_t total = src.numel() * src.element_size();
  if (total == 0) return;
  const int64_t rows = dst.dim() >= 2 ? dst.size(0) : 1;
  const int64_t row_bytes = total / rows;
  const int64_t row_stride = rows > 1 ? dst.stride(0) * dst.element_size() : row_bytes;
  char* d = static_cast<char*>(dst.data_ptr());
  const char* s = static_cast<const char*>(src.data_ptr());
  const auto d0 = reinterpret_cast<std::uintptr_t>(d), s0 = reinterpret_cast<std::uintptr_t>(s);
  const auto dst_span = static_cast<std::uintptr_t>((rows - 1) * row_stride + row_bytes);  // first to last byte
  TORCH_CHECK(d0 + dst_span <= s0 || s0 + static_cast<std::uintptr_t>(total) <= d0,
              "stream_copy: dst and src overlap in memory");

  const bool stream = kStreamingStores && total >= kStreamMinBytes;
  const int64_t pieces = (total + kPieceBytes - 1) / kPieceBytes;
  at::parallel_for(0, pieces, 1, [&](int64_t begin, int64_t end) {
    int64_t off = begin * kPieceBytes;  // src offset; a run goes to the end of its row or of the thread's pieces
    const int64_t stop = std::min(end * kPieceBytes, total);
    while (off < stop) {
      const int64_t row = off / row_bytes, col = off % row_bytes;
      const int64_t n = std::min(row_bytes - col, stop - off);
      copy_run(d + row * row_stride + col, s + off, n, stream);
      off += n;
    }
    if (stream) stream_fence();
  });
}

}  // namespace semiring_ops
