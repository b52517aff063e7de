// semiring_ops::log_contract for CPU tensors (contract in ops.h):
//   out[p, r, s] = sum_t L1[p, r, t] * R1[p, t, s] * exp(L0[p, r, t] + R0[p, t, s] + O0[p, r, s])
// the contraction all log-semiring gradients are made of. L1 / R1 are optional (compile-time flags).
//
// Same tiling as bmm_forward_cpu.cpp (see cpu_common.h): R0 and R1 are the streamed operands (callers pass
// transposed views: gathered per panel, or copied once, see streamed_operand), L0 / L1 are staged per chunk,
// O0 is read once per tile; an output with few columns is computed transposed. The exponent is formed in
// base 2 (LogWeight::to_kernel on each term) and each cell costs one LogWeight::weight (the vectorised
// fast_exp2 for float); the sum uses StdSemiring's accumulator.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("no-trapping-math")  // lets GCC vectorise the selects of semiring.h; see cpu_common.h
#endif

#include <ATen/Dispatch.h>

#include "checks.h"
#include "cpu_common.h"
#include "ops.h"
#include "semiring.h"

namespace semiring_ops {
namespace {

using cpu::AccTile;
using cpu::Strided3;
using cpu::TileGroup;

// Rows per tile: the loop is bound by the exp2 of each cell, so the tile's height barely matters (1 to 4
// rows measured within 10%); 2 keeps the per-group buffers small.
constexpr int kRows = 2;

// Writes the (B, R, S) result of the contraction to out + p * R * S + r * out_rs + s * out_ss; r0 / r1 are
// streamed (see streamed_operand).
template <class T, bool kL1, bool kR1>
void contract_tiles(const at::Tensor& l0, const at::Tensor& l1, const at::Tensor& r0, const at::Tensor& r1,
                    const at::Tensor& o0, T* out_ptr, int64_t out_rs, int64_t out_ss) {
  using Acc = typename StdSemiring::template Accumulator<T, false>;
  constexpr int kCols = cpu::kTileCols<T>;
  using Tile = AccTile<Acc, kRows, kCols>;

  const int64_t R = l0.size(1), K = l0.size(2), S = r0.size(2);
  const Strided3<T> L0 = cpu::strided3<T>(l0), R0 = cpu::strided3<T>(r0), O0 = cpu::strided3<T>(o0);
  const Strided3<T> L1 = kL1 ? cpu::strided3<T>(l1) : L0;  // unused when absent
  const Strided3<T> R1 = kR1 ? cpu::strided3<T>(r1) : R0;
  const auto to_kernel = [](T x) { return LogWeight::to_kernel(x); };
  const auto identity = [](T x) { return x; };

  cpu::parallel_groups<kRows, kCols>(l0.size(0), R, S, K, [&](const TileGroup& g) {
    T l0_buf[cpu::kChunk * kRows], l1_buf[kL1 ? cpu::kChunk * kRows : 1];
    T r0_buf[cpu::kChunk * kCols], r1_buf[kR1 ? cpu::kChunk * kCols : 1];
    Tile acc[cpu::kGroupBlocks];
    // O0 in the kernel domain; cells past the edge get 0 (computed, never written out).
    T o0k[cpu::kGroupBlocks][kRows][kCols];
    for (int64_t blk = 0; blk < g.blocks; ++blk) {
      acc[blk].init();
      for (int i = 0; i < kRows; ++i) {
        const int64_t r = blk * kRows + i;
        for (int j = 0; j < kCols; ++j)
          o0k[blk][i][j] = r < g.nrows && j < g.ncols ? to_kernel(*O0.at(g.p, g.row0 + r, g.col0 + j)) : T(0);
      }
    }
    for (int64_t t0 = 0; t0 < K; t0 += cpu::kChunk) {
      const int64_t nt = std::min(cpu::kChunk, K - t0);
      int64_t ld0, ld1 = 0;
      const T* panel0 = cpu::right_panel<kCols>(R0, g.p, t0, nt, g.col0, g.ncols, r0_buf, ld0);
      const T* panel1 = kR1 ? cpu::right_panel<kCols>(R1, g.p, t0, nt, g.col0, g.ncols, r1_buf, ld1) : nullptr;
      for (int64_t blk = 0; blk < g.blocks; ++blk) {
        const int64_t row0 = g.row0 + blk * kRows, nrows = std::min<int64_t>(kRows, g.nrows - blk * kRows);
        cpu::stage_left<kRows>(L0, g.p, row0, nrows, t0, nt, l0_buf, to_kernel);
        if constexpr (kL1) cpu::stage_left<kRows>(L1, g.p, row0, nrows, t0, nt, l1_buf, identity);
        const T(&o0_tile)[kRows][kCols] = o0k[blk];
        // The hot loop, on a local copy of the tile (which the compiler may keep in registers): vectorised
        // over j.
        Tile tile = acc[blk];
        for (int64_t t = 0; t < nt; ++t) {
          const T* r0_row = panel0 + t * ld0;
          const T* r1_row = kR1 ? panel1 + t * ld1 : nullptr;
          for (int i = 0; i < kRows; ++i) {
            const T l0i = l0_buf[t * kRows + i];
            const T l1i = kL1 ? l1_buf[t * kRows + i] : T(1);
            for (int j = 0; j < kCols; ++j) {
              T v = LogWeight::weight(l0i + LogWeight::to_kernel(r0_row[j]) + o0_tile[i][j]);
              if constexpr (kL1 && kR1) {
                v = (l1i * r1_row[j]) * v;
              } else if constexpr (kL1) {
                v = l1i * v;
              } else if constexpr (kR1) {
                v = r1_row[j] * v;
              }
              Acc x = tile.get(i, j);
              x.add(v, 0);
              tile.put(i, j, x);
            }
          }
        }
        acc[blk] = tile;
      }
    }
    for (int64_t r = 0; r < g.nrows; ++r) {
      const Tile& tile = acc[r / kRows];
      T* dst = out_ptr + g.p * R * S + (g.row0 + r) * out_rs + g.col0 * out_ss;
      for (int64_t j = 0; j < g.ncols; ++j)
        dst[j * out_ss] = tile.get(static_cast<int>(r % kRows), static_cast<int>(j)).result();
    }
  });
}

}  // namespace

at::Tensor log_contract(const at::Tensor& l0, const std::optional<at::Tensor>& l1, const at::Tensor& r0,
                        const std::optional<at::Tensor>& r1, const at::Tensor& o0) {
  check_contract_args(l0, l1, r0, r1, o0);
  TORCH_CHECK(l0.device().is_cpu(), "log_contract (CPU): got L0 ", describe(l0));
  const int64_t B = l0.size(0), R = l0.size(1), K = l0.size(2), S = r0.size(2);
  at::Tensor out = new_output(l0, {B, R, S}, l0.options());
  if (out.numel() == 0) return out;
  if (K == 0) return out.zero_();

  AT_DISPATCH_FLOATING_TYPES(l0.scalar_type(), "semiring_log_contract_cpu", [&] {
    // For few columns (see prefer_transposed), compute instead
    //   out^T[p, s, r] = sum_t R1^T[p, s, t] L1^T[p, t, r] exp(R0^T[p, s, t] + L0^T[p, t, r] + O0^T[p, s, r]):
    // the same terms in the same order of t (equal up to rounding, as the compiler may fuse the to_kernel
    // multiply of the streamed operand into the add).
    const bool transposed = cpu::prefer_transposed<kRows, cpu::kTileCols<scalar_t>>(R, S);
    const auto t = [](const at::Tensor& x) { return x.transpose(1, 2); };
    const int64_t rows = transposed ? S : R;
    const at::Tensor left0 = transposed ? t(r0) : l0;
    const at::Tensor right0 = cpu::streamed_operand<kRows>(transposed ? t(l0) : r0, rows);
    const std::optional<at::Tensor> left1 = transposed ? r1 : l1, right1_src = transposed ? l1 : r1;
    const at::Tensor left1_t = left1 ? (transposed ? t(*left1) : *left1) : at::Tensor();
    const at::Tensor right1 =
        right1_src ? cpu::streamed_operand<kRows>(transposed ? t(*right1_src) : *right1_src, rows) : at::Tensor();
    const at::Tensor out0 = transposed ? t(o0) : o0;
    scalar_t* const out_ptr = out.data_ptr<scalar_t>();
    const int64_t out_rs = transposed ? 1 : S, out_ss = transposed ? S : 1;
    const auto run = [&](auto has_left1, auto has_right1) {
      contract_tiles<scalar_t, decltype(has_left1)::value, decltype(has_right1)::value>(
          left0, left1_t, right0, right1, out0, out_ptr, out_rs, out_ss);
    };
    if (left1 && right1_src) {
      run(std::true_type{}, std::true_type{});
    } else if (left1) {
      run(std::true_type{}, std::false_type{});
    } else if (right1_src) {
      run(std::false_type{}, std::true_type{});
    } else {
      run(std::false_type{}, std::false_type{});
    }
  });
  return out;
}

}  // namespace semiring_ops
