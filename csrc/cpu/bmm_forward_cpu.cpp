// semiring_ops::bmm_forward for CPU tensors (contract in ops.h):
//   out[p, i, j] = (+)_t  to_kernel(a[p, i, t]) (x) to_kernel(b[p, t, j])   for the semiring S,
// accumulated in order of t with S's Accumulator, plus the selected t (arg) for max / min when asked.
//
// Layout (see cpu_common.h): b's rows are streamed (read in place when contiguous, else gathered per panel
// or copied once, see streamed_operand); a is read a scalar at a time with any strides. Each tile of
// kRows x kCols outputs holds its accumulators in an AccTile; for each t, each row's to_kernel(a[i, t]) is
// combined with the contiguous b[t, tile columns] (to_kernel applied in the loop, where it is free or one
// FMA), a loop the compiler vectorises over the columns and, for one-member accumulators, keeps in
// registers. 16-bit inputs are converted to float once, before the kernel (bmm_forward). An output with few
// columns (matrix-vector) is computed transposed, out^T = b^T a^T.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("no-trapping-math")  // lets GCC vectorise the selects of semiring.h; see cpu_common.h
#endif

#include <ATen/Dispatch.h>

#include <limits>

#include "checks.h"
#include "cpu_common.h"
#include "ops.h"
#include "semiring.h"

namespace semiring_ops {
namespace {

using cpu::AccTile;
using cpu::Strided3;
using cpu::TileGroup;

// Rows per tile. With kTileCols columns (4 AVX registers of floats), 3 rows of one-member accumulators (sum;
// max / min without arg, whose index member the hot loop never touches) fill 12 registers, which the
// compiler keeps across t; two-member ones (log-sum-exp, arg) get 2 rows.
template <class S, bool kArg> constexpr int rows_per_tile() {
  return (S::kSelects && !kArg) || std::is_same<S, StdSemiring>::value ? 3 : 2;
}

// Whether S::times commutes (true of IEEE + and *), so that the transposed output out^T = b^T (x) a^T has
// the same terms in the same order of t, hence the same values and args (bit for bit for max, min and std;
// for log up to rounding, as the compiler may fuse the to_kernel multiply of b into the add). Semirings not
// listed here are never transposed.
template <class S> constexpr bool times_commutes() {
  return std::is_same<S, LogSemiring>::value || std::is_same<S, MaxSemiring>::value ||
         std::is_same<S, MinSemiring>::value || std::is_same<S, StdSemiring>::value;
}

template <class S, class scalar_t, bool kArg>
void bmm_tiles(const at::Tensor& a, const at::Tensor& b, at::Tensor& out, at::Tensor& arg) {
  using acc_t = at::opmath_type<scalar_t>;
  using Acc = typename S::template Accumulator<acc_t, kArg>;
  constexpr int kRows = rows_per_tile<S, kArg>();
  constexpr int kCols = cpu::kTileCols<acc_t>;
  using Tile = AccTile<Acc, kRows, kCols>;

  const int64_t n = a.size(1), k = a.size(2), m = b.size(2);
  // The kernel computes left (x) right with right's rows streamed; for few columns it computes out^T.
  const bool transposed = times_commutes<S>() && cpu::prefer_transposed<kRows, kCols>(n, m);
  const at::Tensor left = transposed ? b.transpose(1, 2) : a;
  const int64_t rows = left.size(1);
  const at::Tensor right = cpu::streamed_operand<kRows>(transposed ? a.transpose(1, 2) : b, rows);
  const int64_t cols = right.size(2);
  const int64_t out_row_stride = transposed ? 1 : m, out_col_stride = transposed ? m : 1;
  const Strided3<scalar_t> A = cpu::strided3<scalar_t>(left);
  const Strided3<scalar_t> Bm = cpu::strided3<scalar_t>(right);
  acc_t* const out_ptr = out.data_ptr<acc_t>();
  int64_t* const arg_ptr = kArg ? arg.data_ptr<int64_t>() : nullptr;

  cpu::parallel_groups<kRows, kCols>(a.size(0), rows, cols, k, [&](const TileGroup& g) {
    acc_t a_buf[cpu::kChunk * kRows];
    acc_t b_buf[cpu::kChunk * kCols];
    Tile acc[cpu::kGroupBlocks];
    for (int64_t blk = 0; blk < g.blocks; ++blk) acc[blk].init();
    for (int64_t t0 = 0; t0 < k; t0 += cpu::kChunk) {
      const int64_t nt = std::min(cpu::kChunk, k - t0);
      int64_t ldb;
      const acc_t* panel = cpu::right_panel<kCols>(Bm, g.p, t0, nt, g.col0, g.ncols, b_buf, ldb);
      for (int64_t blk = 0; blk < g.blocks; ++blk) {
        const int64_t row0 = blk * kRows;
        cpu::stage_left<kRows>(A, g.p, g.row0 + row0, std::min<int64_t>(kRows, g.nrows - row0), t0, nt, a_buf,
                               [](acc_t x) { return S::to_kernel(x); });
        // The hot loop, on a local copy of the tile (which the compiler may keep in registers): vectorised
        // over j.
        Tile tile = acc[blk];
        for (int64_t t = 0; t < nt; ++t) {
          const acc_t* b_row = panel + t * ldb;
          const acc_t* a_col = a_buf + t * kRows;
          const int32_t kt = static_cast<int32_t>(t0 + t);
          for (int i = 0; i < kRows; ++i) {
            const acc_t ai = a_col[i];
            for (int j = 0; j < kCols; ++j) {
              Acc x = tile.get(i, j);
              x.add(S::times(ai, S::to_kernel(b_row[j])), kt);
              tile.put(i, j, x);
            }
          }
        }
        acc[blk] = tile;
      }
    }
    for (int64_t r = 0; r < g.nrows; ++r) {
      const Tile& tile = acc[r / kRows];
      const int i = static_cast<int>(r % kRows);
      const int64_t row_offset = g.p * n * m + (g.row0 + r) * out_row_stride;
      for (int64_t j = 0; j < g.ncols; ++j) {
        const Acc x = tile.get(i, static_cast<int>(j));
        const int64_t offset = row_offset + (g.col0 + j) * out_col_stride;
        out_ptr[offset] = x.result();
        if constexpr (kArg) arg_ptr[offset] = x.arg();
      }
    }
  });
}

}  // namespace

std::vector<at::Tensor> bmm_forward(const at::Tensor& a, const at::Tensor& b, int64_t semiring_id,
                                    bool with_arg) {
  check_bmm_args(a, b);
  TORCH_CHECK(a.device().is_cpu(), "semiring bmm kernel (CPU): got a ", describe(a));
  TORCH_CHECK(a.size(2) <= std::numeric_limits<int32_t>::max(),
              "semiring bmm kernel (CPU): k must fit in int32, got a ", describe(a));
  const int64_t B = a.size(0), n = a.size(1), k = a.size(2), m = b.size(2);
  const at::ScalarType acc_type = at::toOpMathType(a.scalar_type());
  at::Tensor out = new_output(a, {B, n, m}, a.options().dtype(acc_type));
  at::Tensor arg = a.new_empty({0}, a.options().dtype(at::kLong));

  const bool found = dispatch_semiring(semiring_id, [&](auto semiring) {
    using S = decltype(semiring);
    const bool want_arg = S::kSelects && with_arg;
    if (want_arg) arg = new_output(a, {B, n, m}, a.options().dtype(at::kLong));
    if (out.numel() == 0) return;
    if (k == 0) {
      AT_DISPATCH_FLOATING_TYPES(acc_type, "semiring_bmm_forward_cpu_zero",
                                 [&] { out.fill_(S::template zero<scalar_t>()); });
      if (want_arg) arg.zero_();
      return;
    }
    // 16-bit inputs are read as float: one conversion pass over a and b, O(n k + k m) against the product's
    // O(n k m), and one kernel per accumulation type (half the instantiations, a shorter first build).
    const at::Tensor a_acc = a.scalar_type() == acc_type ? a : a.to(acc_type);
    const at::Tensor b_acc = b.scalar_type() == acc_type ? b : b.to(acc_type);
    AT_DISPATCH_FLOATING_TYPES(acc_type, "semiring_bmm_forward_cpu", [&] {
      if constexpr (S::kSelects) {
        if (want_arg) return bmm_tiles<S, scalar_t, true>(a_acc, b_acc, out, arg);
      }
      bmm_tiles<S, scalar_t, false>(a_acc, b_acc, out, arg);
    });
  });
  TORCH_CHECK(found, "semiring bmm kernel (CPU): unknown semiring id ", semiring_id);
  return {out, arg};
}

}  // namespace semiring_ops
