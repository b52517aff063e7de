// Building blocks shared by the CPU kernels (bmm_forward_cpu.cpp, log_contract_cpu.cpp).
//
// Both kernels compute an output (B, R, S) as a reduction over t of a cell function of left[p, r, t] (one
// scalar per row) and right[p, t, s] (one contiguous row per t). The work is organised as:
//   - tiles of kRows x kCols outputs, whose accumulators live in an AccTile (structure of arrays, so that the
//     loop over the tile's columns vectorises and, for small accumulators, stays in registers across t);
//   - groups of up to kGroupBlocks tiles stacked over rows, sharing one column panel: t is walked in chunks of
//     kChunk, and per chunk the panel of the right operand is staged once (right_panel: a pointer into the
//     operand, or a converted / gathered / padded copy for 16-bit inputs, strided columns and edge tiles)
//     and then used by every tile of the group, whose left operand chunk is staged by stage_left;
//   - the kernel's hot loop, for each t and each row of a tile, runs over the kCols columns.
// parallel_groups spreads the tiles over threads with at::parallel_for.
//
// The hot loops are plain scalar code calling the semiring.h functors. GCC vectorises them only with
// if-conversion of floating-point selects, which it refuses under -ftrapping-math (its default); so each CPU
// kernel file starts with `#pragma GCC optimize("no-trapping-math")` before any include. That changes no
// result (inf and NaN follow IEEE as before); it only lets the compiler evaluate both sides of a select.
#pragma once

#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "semiring.h"
#include "tensor_api.h"

#if defined(AT_PARALLEL_OPENMP) && AT_PARALLEL_OPENMP && !defined(_OPENMP)
#warning "semiring_ops CPU kernels built without -fopenmp: at::parallel_for will run on one thread"
#endif

namespace semiring_ops {
namespace cpu {

// Columns per tile: 4 AVX registers of floats, 6 of doubles. More than 16 on purpose: GCC fully unrolls
// loops of at most 16 iterations before vectorising, and would then vectorise the wrong loop.
template <class acc_t> constexpr int kTileCols = sizeof(acc_t) == 4 ? 32 : 24;
// Rows of t per chunk, and tiles per group: the staging buffers (on the stack, at most 24 KiB each) hold
// kChunk x kCols values of the right operand and kChunk x kRows of the left one; a group's accumulators
// are kGroupBlocks AccTiles.
constexpr int64_t kChunk = 128;
constexpr int64_t kGroupBlocks = 16;

// ---------------------------------------------------------------- operands

// A 3-D operand as a pointer and element strides: element (p, r, c) is at ptr[p*sp + r*sr + c*sc].
// The strides are int64, so offsets never overflow 32 bits.
template <class T> struct Strided3 {
  const T* ptr;
  int64_t sp, sr, sc;
  const T* at(int64_t p, int64_t r, int64_t c) const { return ptr + p * sp + r * sr + c * sc; }
};

template <class T> Strided3<T> strided3(const at::Tensor& t) {
  return {t.data_ptr<T>(), t.stride(0), t.stride(1), t.stride(2)};
}

// The operand whose rows are streamed (the right one), for an output of `rows` rows. right_panel reads any
// strides, gathering a strided panel into its buffer; but when each panel is read by several groups (more
// than kGroupBlocks tiles over rows), an operand whose last dimension is strided is first copied with that
// dimension contiguous, once. A broadcast batch (stride 0) is copied as one matrix and broadcast again,
// never materialised B times.
template <int kRows> at::Tensor streamed_operand(const at::Tensor& t, int64_t rows) {
  const bool reused = rows > kGroupBlocks * kRows;
  if (!reused || t.size(2) <= 1 || t.stride(2) == 1) return t;
  if (t.size(0) > 1 && t.stride(0) == 0) return t.select(0, 0).contiguous().unsqueeze(0).expand(t.sizes());
  return t.contiguous();
}

// ---------------------------------------------------------------- accumulators

// The number of data members of an aggregate accumulator, found by brace-initialisation.
struct AnyField {
  template <class U> constexpr operator U() const noexcept;
};
template <class A, class... F> constexpr auto braces_init(int) -> decltype(A{F{}...}, true) { return true; }
template <class A, class... F> constexpr bool braces_init(...) { return false; }
template <class A> constexpr int field_count() {
  if constexpr (braces_init<A, AnyField, AnyField, AnyField>(0)) return 3;
  else if constexpr (braces_init<A, AnyField, AnyField>(0)) return 2;
  else return 1;
}

template <class U> using bare_t = std::remove_cv_t<std::remove_reference_t<U>>;

// Storage of kRows x kCols accumulators member by member (structure of arrays): member f of cell (i, j)
// lives at f<f>[i][j], in the member's own type; get / put move one cell in and out of its struct through
// structured bindings. Written for the one- and two-member accumulators of semiring.h.
template <class Acc, int kRows, int kCols, int kFields = field_count<Acc>()> struct AccStorage {
  static_assert(kFields == 1 || kFields == 2, "AccTile: accumulators of one or two members only");
};

template <class Acc, int kRows, int kCols> struct AccStorage<Acc, kRows, kCols, 1> {
  static auto member0(const Acc& a) {
    const auto& [x0] = a;
    return bare_t<decltype(x0)>{};
  }
  decltype(member0(Acc{})) f0[kRows][kCols];

  Acc get(int i, int j) const {
    Acc a;
    auto& [x0] = a;
    x0 = f0[i][j];
    return a;
  }
  void put(int i, int j, const Acc& a) {
    const auto& [x0] = a;
    f0[i][j] = x0;
  }
};

template <class Acc, int kRows, int kCols> struct AccStorage<Acc, kRows, kCols, 2> {
  static auto member0(const Acc& a) {
    const auto& [x0, x1] = a;
    return bare_t<decltype(x0)>{};
  }
  static auto member1(const Acc& a) {
    const auto& [x0, x1] = a;
    return bare_t<decltype(x1)>{};
  }
  decltype(member0(Acc{})) f0[kRows][kCols];
  decltype(member1(Acc{})) f1[kRows][kCols];

  Acc get(int i, int j) const {
    Acc a;
    auto& [x0, x1] = a;
    x0 = f0[i][j];
    x1 = f1[i][j];
    return a;
  }
  void put(int i, int j, const Acc& a) {
    const auto& [x0, x1] = a;
    f0[i][j] = x0;
    f1[i][j] = x1;
  }
};

// The accumulators of one tile. The compiler turns get / put into plain vector loads and stores (or keeps
// the members in registers across the t loop), so the math stays in semiring.h.
template <class Acc, int kRows, int kCols> struct AccTile : AccStorage<Acc, kRows, kCols> {
  static_assert(std::is_aggregate<Acc>::value && std::is_trivially_copyable<Acc>::value,
                "AccTile needs a plain aggregate accumulator");
  void init() {
    Acc a;
    a.init();
    for (int i = 0; i < kRows; ++i)
      for (int j = 0; j < kCols; ++j) this->put(i, j, a);
  }
};

// ---------------------------------------------------------------- staging

// buf[t * kRows + i] = f(x(p, row0 + min(i, nrows - 1), t0 + t)) for t < nt, in the accumulation type.
// Rows past the edge repeat the last row: their cells are computed and never written out.
template <int kRows, class acc_t, class scalar_t, class F>
void stage_left(const Strided3<scalar_t>& x, int64_t p, int64_t row0, int64_t nrows, int64_t t0, int64_t nt,
                acc_t* buf, F f) {
  for (int i = 0; i < kRows; ++i) {
    const scalar_t* src = x.at(p, row0 + std::min<int64_t>(i, nrows - 1), t0);
    for (int64_t t = 0; t < nt; ++t) buf[t * kRows + i] = f(static_cast<acc_t>(src[t * x.sc]));
  }
}

// The rows t0 .. t0 + nt - 1, columns col0 .. col0 + kCols - 1 of the streamed operand x, in the accumulation
// type: returns p with element (t, j) at p[t * ld + j]. Points into x when it can (same type, contiguous
// rows, a whole tile of columns); otherwise converts / gathers into buf (nt * kCols values), padding the
// columns past ncols with 0.
template <int kCols, class acc_t, class scalar_t>
const acc_t* right_panel(const Strided3<scalar_t>& x, int64_t p, int64_t t0, int64_t nt, int64_t col0,
                         int64_t ncols, acc_t* buf, int64_t& ld) {
  const scalar_t* src = x.at(p, t0, col0);
  if constexpr (std::is_same<acc_t, scalar_t>::value) {
    if (ncols == kCols && x.sc == 1) {
      ld = x.sr;
      return src;
    }
  }
  if (x.sc == 1) {
    for (int64_t t = 0; t < nt; ++t) {
      const scalar_t* s = src + t * x.sr;
      acc_t* d = buf + t * kCols;
      for (int64_t j = 0; j < ncols; ++j) d[j] = static_cast<acc_t>(s[j]);
    }
  } else {
    // A strided panel (typically a transposed view): a blocked transpose, reading along t.
    for (int64_t j = 0; j < ncols; ++j) {
      const scalar_t* s = src + j * x.sc;
      for (int64_t t = 0; t < nt; ++t) buf[t * kCols + j] = static_cast<acc_t>(s[t * x.sr]);
    }
  }
  for (int64_t t = 0; t < nt; ++t)
    for (int64_t j = ncols; j < kCols; ++j) buf[t * kCols + j] = acc_t(0);
  ld = kCols;
  return buf;
}

// ---------------------------------------------------------------- scheduling

// Whether computing the transposed output, (B, S, R) instead of (B, R, S), pads less work: tiles are
// kRows x kCols, so an output with few columns (a matrix-vector product) would waste most of each tile's
// columns. The kernels then swap their operands' roles and write the output transposed.
template <int kRows, int kCols> bool prefer_transposed(int64_t R, int64_t S) {
  const auto padded = [](int64_t x, int64_t q) { return (x + q - 1) / q * q; };
  return padded(S, kRows) * padded(R, kCols) < padded(R, kRows) * padded(S, kCols);
}

// Up to kGroupBlocks tiles stacked over rows: batch p, rows row0 .. row0 + nrows - 1 (tile b of the group
// starts at row0 + b * kRows), columns col0 .. col0 + ncols - 1.
struct TileGroup {
  int64_t p, row0, nrows, col0, ncols, blocks;
};

// Calls body(group) for every group of a (B, R, S) output, in parallel over tiles. Tiles are ordered by
// batch, then column block, then row block (innermost), and a group is a run of consecutive tiles of one
// task with one batch and column block. `depth` (the reduction length) sets the grain so that a task is
// worth starting.
template <int kRows, int kCols, class Body>
void parallel_groups(int64_t B, int64_t R, int64_t S, int64_t depth, const Body& body) {
  const int64_t row_blocks = (R + kRows - 1) / kRows;
  const int64_t col_blocks = (S + kCols - 1) / kCols;
  const int64_t tiles = B * row_blocks * col_blocks;
  const int64_t cells_per_tile = static_cast<int64_t>(kRows) * kCols * std::max<int64_t>(depth, 1);
  const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 18) / cells_per_tile);
  at::parallel_for(0, tiles, grain, [&](int64_t begin, int64_t end) {
    for (int64_t index = begin; index < end;) {
      const int64_t rb = index % row_blocks;
      const int64_t cb = (index / row_blocks) % col_blocks;
      const int64_t p = index / row_blocks / col_blocks;
      const int64_t blocks = std::min({kGroupBlocks, end - index, row_blocks - rb});
      const int64_t row0 = rb * kRows, col0 = cb * kCols;
      body(TileGroup{p, row0, std::min<int64_t>(blocks * kRows, R - row0), col0,
                     std::min<int64_t>(kCols, S - col0), blocks});
      index += blocks;
    }
  });
}

}  // namespace cpu
}  // namespace semiring_ops
