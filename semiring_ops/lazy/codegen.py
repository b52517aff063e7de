"""Kernel sources for a plan: the formula's cell code (formula.Emitter) inside a CPU or a CUDA skeleton.

Both skeletons keep one reducer (csrc/lazy/reducers.h) per output row and feed it the formula's value at
every (row, j) in increasing j; they differ in where the variables live:

CPU (C++, g++, loaded with ctypes): parallel over (batch, row) with OpenMP; the row's outer variables and the
parameters are scalars in registers; the inner variables are passed transposed, (D, n), and j is walked in
groups of ``CPU_LANES`` with one reducer per lane, so the loop over lanes vectorises; the lanes are merged at
the end (merge keeps the lowest index among ties; sums fold each lane into a second reducer every
CPU_BLOCK_GROUPS groups: block sums, csrc/lazy/reducers.h); the last j (fewer than a group) go to lane 0 in a scalar
loop, a second copy of the cell (the k-best instead keeps one reducer per row, fed a group of lanes at a time,
csrc/lazy/kbest.h add_lanes). Formulas of more than CPU_SCALAR_NODES nodes get one scalar loop over j
instead (the same lanes, so the same sums), one copy of the cell, whose numbers (formula.Num) are read from
the number vector where they are used, behind an empty asm per j that the compiler cannot hoist loads over:
thousands of numbers held in registers across the loop (a parameter each, or the vectoriser's hoisted
broadcasts) made g++'s register allocation quadratic (minutes for 2,000 numbers); now the compile time grows
about linearly with the formula's size.

CUDA (NVRTC): the tiled 1-D map-reduce scheme. Each thread owns ``rows`` output rows (i, i + block, ...) and
their reducers in registers; the block walks j in tiles whose inner variables are staged in shared memory as
rows of ``stride`` values (one 16-byte load per 4 values, broadcast to all threads), a sum folding each tile's
partial sums into a second reducer (block sums); when the rows alone
cannot fill the GPU, the 2-D scheme splits j over ``gridDim.y`` blocks, which park their reducers in a
workspace that a second kernel merges (the semiring merge). The number vector is one more kernel argument,
read where used (``nums[k]``); large formulas get fewer copies of the cell (cuda_config) and, past
LARGE_FORMULA_NODES nodes, the CPU's remedy: a j loop that is not unrolled and the number vector behind an
empty asm per j. Without it NVVM hoisted the 2,000 loads of a 2,000-number formula out of the j loop into
registers of their own and NVRTC took 15-31 s for it on an H100 host (6 s with it).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from .formula import Emitter, Formula, InnerProduct, Var, _postorder, node_count, replace_nodes, strength_reduce
from .plan import Plan
from .wide import WIDE_SLOT, WideSums, component_term, find_wide_sums, wide_sums
from .wide_chunks import (
    WIDE_BLOCK,
    WIDE_CHUNK,
    WIDE_SUMS_BYTES,
    WIDE_TILE,
    ChunkKernel,
    ChunkLayout,
    alignment_flags,
    chunk_phase,
    sum_entry,
)

__all__ = ["CPU_LANES", "CudaConfig", "cpu_source", "cuda_config", "cuda_source"]

CPU_LANES = 16
CPU_BLOCK_GROUPS = 64  # block sums (csrc/lazy/reducers.h): the lanes are folded every 64 groups (1,024 terms)

# The headers a kernel includes: on the CPU one header, first and alone, which the host compiler takes precompiled
# (host_compiler.py); NVRTC compiles the CUDA source whole.
_INCLUDES = {
    "cpu": '#include "lazy/host_prelude.h"\n',
    "cuda": '#include "semiring.h"\n#include "lazy/math.h"\n#include "lazy/reducers.h"\n',
}
_PRELUDE = """using namespace semiring_ops;
using namespace semiring_ops::lazy;
typedef {ctype} T;
typedef {reducer} Reducer;
"""


def _ctype(dtype_name: str) -> str:
    return {"float32": "float", "float64": "double"}[dtype_name]


def _prelude(plan: Plan, dtype_name: str, target: str) -> str:
    ctype = _ctype(dtype_name)
    reducer = plan.reduction.cpp_reducer(ctype, plan.formula.dim, plan.with_arg, target)
    return (
        f"// semiring_ops.lazy kernel for: {plan.key}\n"
        + _INCLUDES[target]
        + _PRELUDE.format(ctype=ctype, reducer=reducer)
    )


@dataclass(frozen=True)
class GramReads:
    """Where a skeleton finds a routed plan's matrices (plan.CallArgs.grams) for InnerProduct n, as C expressions
    at the current (row, j): ``gram(n)`` the matrix entry, ``outer_norm(n)`` the row's squared norm (read once
    per row), ``inner_norm(n)`` the inner term's."""

    gram: Callable[[int], str]
    outer_norm: Callable[[int], str]
    inner_norm: Callable[[int], str]


GRAM_SLOT = 1 << 21  # placeholder variables of slot GRAM_SLOT + n stand for InnerProduct n in the cell
# a squared distance read as |x|^2 + |y|^2 - 2 x.y below this fraction of |x|^2 + |y|^2 is summed again per cell
# from the variables (the cancellation bound: an absolute error of a few ulp of |x|^2 + |y|^2 is then at most
# 1/GRAM_CANCEL of the distance's own size; docs/lazy.md, "The matrix-unit route")
GRAM_CANCEL = 64


def _gram_cells(
    formula: Formula,
    reads: GramReads,
    read_at: Callable[[Var, str], str],
    number: Callable[[int], str],
    prefix: str,
) -> tuple[Formula, list[str], WideSums]:
    """The formula with its InnerProduct nodes as placeholders (slot GRAM_SLOT + n, read as ``q{n}_v``), the
    statements once per row (the rows' norms) and those that compute the placeholders, in the places of
    wide.WideSums: before a group of lanes (one vectorised pass over the matrix row, then the rare cells that
    cancel one by one), in a lane, in a scalar cell. A squared distance that cancels (below 1 / GRAM_CANCEL
    of the norms' sum) is summed from the variables as the plain kernel sums it, in increasing d."""
    nodes = [node for node in _postorder(formula) if isinstance(node, InnerProduct)]
    out = WideSums(formula)
    hoisted: list[str] = []
    replaced: dict[int, Formula] = {}
    for node in nodes:
        n, x = node.index, node.children[0]
        value = reads.gram(n)
        cancels, resum = None, []  # the C condition under which a value v is summed again; the loop that does it
        if node.kind == "sqdist":
            nx, ny = f"{prefix}q{n}_nx", reads.inner_norm(n)
            hoisted.append(f"const T {nx} = {reads.outer_norm(n)};")
            value = f"{nx} + {ny} - T(2) * {value}"
            lines, term = component_term(x, read_at, number, f"{prefix}q{n}_")
            cancels = lambda v, nx=nx, ny=ny: f"!({v} >= T({1.0 / GRAM_CANCEL!r}) * ({nx} + {ny}))"  # noqa: E731
            resum = [f"  for (int64_t d = 0; d < {x.dim}; ++d) {{", *("    " + line for line in lines)]
            resum += [f"    s += {term};", "  }"]

        def fill(v: str, cancels=cancels, resum=resum) -> list[str]:
            if cancels is None:
                return []
            return [f"if ({cancels(v)}) {{", "  T s = T(0);", *resum, f"  {v} = s;", "}"]

        out.group += [f"T q{n}[kLanes];"]
        if cancels is not None:  # one vectorised pass that also ORs the cancellation flags, then the rare re-sums
            out.group += [
                f"int q{n}_bad = 0;",
                "for (int l = 0; l < kLanes; ++l) {",
                "  const int64_t j = j0 + l;",
                f"  q{n}[l] = {value};",
                f"  q{n}_bad |= {cancels(f'q{n}[l]')};",
                "}",
                f"if (q{n}_bad)",
                "  for (int l = 0; l < kLanes; ++l) {",
                "    const int64_t j = j0 + l;",
                *("    " + line for line in fill(f"q{n}[l]")),
                "  }",
            ]
        else:
            out.group += [
                "for (int l = 0; l < kLanes; ++l) {",
                "  const int64_t j = j0 + l;",
                f"  q{n}[l] = {value};",
                "}",
            ]
        out.lane.append(f"const T q{n}_v = q{n}[l];")
        out.scalar += [f"T q{n}_v = {value};", *fill(f"q{n}_v")]
        replaced[id(node)] = _gram_placeholder(node)
    out.formula = replace_nodes(formula, replaced) if replaced else formula
    return out.formula, hoisted, out


def _gram_placeholder(node: InnerProduct) -> Var:
    return Var("j", 1, slot=GRAM_SLOT + node.index)


def _invariant(plan: Plan) -> Callable[[Var], bool]:
    """Whether a variable of the cell is the same at every j (not a placeholder, not an inner variable)."""
    return lambda var: var.slot < WIDE_SLOT and plan.role(var.slot) != "inner"


def _is_inner(plan: Plan) -> Callable[[Var], bool]:
    """Whether a variable of the cell changes with j (an inner variable, or a routed inner product's value)."""
    return lambda var: var.slot >= GRAM_SLOT or plan.role(var.slot) == "inner"


def _cell(
    plan: Plan,
    read: Callable[[Var, int], str],
    read_at: Callable[[Var, str], str],
    prefix: str,
    number: Callable[[int, bool], str],
    grams: GramReads | None = None,
    read_sum: Callable[[int], str] | None = None,
) -> tuple[list[str], list[str], WideSums]:
    """(statements computed once per row, statements computing ``{prefix}f[kIn]``, the formula's value at
    (row, j), and its wide sums, wide.py, with a routed plan's inner products first among them), with variables
    read by read(var, d), or read_at(var, d) with d a C expression in the wide sums' loops, numbers by
    number(k, hoisted) (formula.Emitter) and a routed plan's matrices through ``grams``; with ``read_sum``, the
    wide sums are read from read_sum(n) (the CUDA kernel's chunked sums, wide_chunks.py)."""

    invariant, is_inner = _invariant(plan), _is_inner(plan)

    def placeholder(var: Var) -> str | None:
        if var.slot >= GRAM_SLOT:
            return f"q{var.slot - GRAM_SLOT}_v"
        return WideSums.placeholder(var)

    def read_cell(var: Var, c: int) -> str:  # a placeholder reads its loop's result
        name = placeholder(var)
        return name if name is not None else read(var, c)

    def read_loop(var: Var, d: str) -> str:
        name = placeholder(var)
        return name if name is not None else read_at(var, d)

    formula = strength_reduce(plan.formula, invariant)
    gram_hoisted: list[str] = []
    gram = WideSums(formula)
    if plan.grams:
        assert grams is not None, "a routed plan needs its skeleton's GramReads"
        formula, gram_hoisted, gram = _gram_cells(formula, grams, read_at, lambda k: number(k, False), prefix)
    wide = wide_sums(formula, is_inner, read_loop, lambda k: number(k, False), read_sum)
    em = Emitter(read_cell, prefix=prefix, invariant=invariant, number=number)
    comps = em.emit(wide.formula)
    wide = WideSums(wide.formula, gram.group + wide.group, gram.lane + wide.lane, gram.scalar + wide.scalar, wide.terms)
    cell = [*em.lines, f"const T {prefix}f[{len(comps)}] = {{{', '.join(comps)}}};"]
    return gram_hoisted + em.hoisted, cell, wide


def staged_inner_slots(plan: Plan) -> list[int]:
    """The inner variables a cell reads, in slot order: those of a routed plan's inner products alone are read
    only where a squared distance cancels, from global memory (not staged, not transposed)."""
    inner = [k for k in range(len(plan.arg_cats)) if plan.role(k) == "inner"]
    if not plan.grams:  # (every call of run_cpu asks: no walk of the formula for a plain plan)
        return inner
    skip = {id(node) for node in _postorder(plan.formula) if isinstance(node, InnerProduct)}
    seen = {v.slot for v in _postorder(plan.formula, skip) if isinstance(v, Var)}
    return [k for k in inner if k in seen]


def _indent(lines: list[str], n: int) -> str:
    pad = " " * n
    return "\n".join(pad + line for line in lines)


# ---------------------------------------------------------------- CPU


LARGE_FORMULA_NODES = 256  # formulas of more nodes: numbers read in place behind an asm per j (CPU and CUDA)
CPU_SCALAR_NODES = LARGE_FORMULA_NODES  # formulas of more nodes get the scalar CPU skeleton (one cell copy)


def cpu_source(plan: Plan, dtype_name: str) -> str:
    """extern "C" void lazy_reduce(T* vals, int64_t* idx, const T* const* args, const int64_t* bstride,
    int64_t nbatch, int64_t n_outer, int64_t n_inner, int nthreads, const int64_t* chunks, int64_t n_chunks,
    const int64_t* offsets, const int64_t* ranges): args[k] is slot k (batch stride bstride[k]), and
    args[slots] the number vector when the plan has numbers, then a routed plan's matrices (plan.CallArgs.grams,
    the matrix row-major (n_outer, n_inner)). The last four serve a ranged plan only (null
    and 0 otherwise; _cpu_ranged_rows).

    Two loops over j, of the same results (lane l reduces the j = l mod kLanes of the full groups of kLanes,
    lane 0 the last j, in increasing order): formulas of up to CPU_SCALAR_NODES nodes get the vectorised
    lanes loop and a scalar loop for the last j (two copies of the cell); larger ones one scalar loop, which
    reads the numbers where they are used (module docstring). The k-best keeps one reducer per row instead
    of one per lane (_cpu_kbest_loop): merging K-lists costs more than a reducer fed by vector compares."""
    n_slots = len(plan.arg_cats)
    used: set[tuple[int, int]] = set()  # the (slot, component) of row variables and parameters the cell reads

    def read(var: Var, c: int) -> str:
        if plan.role(var.slot) == "inner":
            return f"g{var.slot}[{c} * g_stride + j]"
        used.add((var.slot, c))
        return f"v{var.slot}_{c}"

    staged = set(staged_inner_slots(plan))

    def read_at(var: Var, d: str) -> str:  # component d, a C expression, of a variable (the wide sums' loops)
        role = plan.role(var.slot)
        if role == "inner" and var.slot not in staged:  # a routed plan's, read where a distance cancels
            return f"g{var.slot}[j * {var.dim} + ({d})]"
        if role == "inner":
            return f"g{var.slot}[({d}) * g_stride + j]"
        return f"a{var.slot}[i * {var.dim} + ({d})]" if role == "outer" else f"a{var.slot}[{d}]"

    scalar = node_count(plan.formula) > CPU_SCALAR_NODES

    def number(k: int, hoisted: bool) -> str:
        return f"nums[{k}]" if scalar and not hoisted else f"numbers[{k}]"

    gram_at = 1 + n_slots if plan.n_numbers else n_slots  # args[gram_at + 3 n + 0, 1, 2]: InnerProduct n's
    grams = GramReads(lambda n: f"gram{n}[i * n_inner + j]", lambda n: f"xnorm{n}[i]", lambda n: f"ynorm{n}[j]")
    # wide sums of a dense vectorised plan: a pass over a tile of rows and all j first (_cpu_tiled_rows)
    tiled = chunk_layout(plan) if not (plan.ranged or scalar) else None
    read_sum = (lambda n: f"wt[{n} * wt_stride + j]") if tiled is not None else None
    hoisted, cell, wide = _cell(plan, read, read_at, "c", number, grams, read_sum)
    loads = [f"const T* a{k} = args[{k}] + b * bstride[{k}];" for k in range(n_slots) if plan.role(k) != "inner"]
    for k, c in sorted(used):
        at = f"i * {plan.arg_dims[k]} + {c}" if plan.role(k) == "outer" else str(c)
        loads.append(f"const T v{k}_{c} = a{k}[{at}];")
    loads += hoisted
    # nums: the number vector behind an empty asm the compiler cannot see through, once per j, so each
    # number is loaded where it is used instead of being hoisted out of the loop into a register of its own
    barrier = ['const T* nums = numbers; asm("" : "+r"(nums));'] if scalar and plan.n_numbers else []
    index = "jmap[j]" if plan.ranged else "static_cast<int32_t>(j)"
    cells = Cells([*wide.lane, *cell], [*wide.scalar, *cell], wide.group)
    if plan.reduction.kind == "kbest":
        group_index = "jmap + j0" if plan.ranged else "static_cast<int32_t>(j0)"
        loop = _cpu_kbest_loop(cells, barrier, scalar, index, group_index)
    else:
        loop = _cpu_lanes_loop(cells, barrier, scalar, index, plan.ranged)
    numbers = [f"const T* numbers = args[{n_slots}];"] if plan.n_numbers else []
    for n in range(plan.grams):
        names = (f"gram{n}", f"xnorm{n}", f"ynorm{n}")
        numbers += [f"const T* {name} = args[{gram_at + 3 * n + k}];" for k, name in enumerate(names)]
    idx_expr = f"idx + row * {plan.index_dim}" if plan.index_dim else "nullptr"
    row_body = [*loads, *loop, f"red.store(vals + row * {plan.value_dim}, {idx_expr});"]
    if plan.ranged:
        rows = _cpu_ranged_rows(plan, row_body)
    elif tiled is not None:
        wide_pass = _cpu_wide_pass(tiled, read_at, lambda k: number(k, False))
        rows = _cpu_tiled_rows(plan, len(tiled.terms), row_body, wide_pass)
    else:
        rows = _cpu_dense_rows(plan, row_body)
    return (
        _prelude(plan, dtype_name, "cpu")
        + f"""constexpr int kLanes = {CPU_LANES};
constexpr int64_t kBlockTerms = {CPU_BLOCK_GROUPS * CPU_LANES};  // terms of a block of a block sum (reducers.h)

// A block of a block sum done: each lane's sum goes into its total, and the lane starts the next block at 0.
static inline void fold(Reducer* lane, Reducer* total) {{
  for (int l = 0; l < kLanes; ++l) {{
    total[l].merge(lane[l]);
    lane[l].init();
  }}
}}

extern "C" void lazy_reduce(T* vals, int64_t* idx, const T* const* args, const int64_t* bstride, int64_t nbatch,
                            int64_t n_outer, int64_t n_inner, int nthreads, const int64_t* chunks,
                            int64_t n_chunks, const int64_t* offsets, const int64_t* ranges) {{
  (void)chunks; (void)n_chunks; (void)offsets; (void)ranges;
{_indent(numbers, 2)}
{_indent(rows, 2)}
}}
"""
    )


def _cpu_dense_rows(plan: Plan, row_body: list[str]) -> list[str]:
    """Every output row (batch included) over every j: OpenMP over the rows; the inner variables are read in
    place (passed transposed, (D, n_inner))."""
    inner = [
        f"const T* g{k} = args[{k}] + b * bstride[{k}];" for k in range(len(plan.arg_cats)) if plan.role(k) == "inner"
    ]
    return [
        "const int64_t rows = nbatch * n_outer, n_terms = n_inner, g_stride = n_inner;",
        "#pragma omp parallel for num_threads(nthreads) schedule(dynamic, 16)",
        "for (int64_t row = 0; row < rows; ++row) {",
        "  const int64_t b = row / n_outer, i = row - b * n_outer;",
        "  (void)i;",
        *("  " + line for line in inner + row_body),
        "}",
    ]


CPU_WIDE_ROWS = 16  # rows per tile of a plan with wide sums: each component of y read from memory serves them
CPU_WIDE_PANEL = 512  # j per panel of the wide pass: a component's panel and the tile's sums stay in L1 / L2
CPU_WIDE_BYTES = 1 << 20  # a thread's buffer of wide sums (the tile's rows x all j) at most: fewer rows beyond


def _cpu_wide_pass(layout: ChunkLayout, read_at: Callable[[Var, str], str], number: Callable[[int], str]) -> list[str]:
    """The wide sums of the tile's rows i0 .. i0 + nr - 1 at every j into wbuf[(n * tile_rows + r) * n_terms + j]:
    by panels of j, then components d (in increasing order, as the loops of wide.py), then rows, then the j of
    the panel (contiguous: vectorised); each panel of a component is read from memory once for the tile."""
    lines = ["std::fill(wbuf.begin(), wbuf.end(), T(0));"]
    for n, x in enumerate(layout.terms):
        term_lines, term = component_term(x, read_at, number, f"wp{n}_")
        lines += [
            f"for (int64_t jp = 0; jp < n_terms; jp += {CPU_WIDE_PANEL}) {{",
            f"  const int64_t je = std::min<int64_t>(n_terms, jp + {CPU_WIDE_PANEL});",
            f"  for (int64_t d = 0; d < {x.dim}; ++d) {{",
            "    for (int64_t r = 0; r < nr; ++r) {",
            "      const int64_t i = i0 + r;",
            f"      T* const w = wbuf.data() + ({n} * tile_rows + r) * n_terms;",
            "#pragma GCC ivdep",
            "      for (int64_t j = jp; j < je; ++j) {",
            *("        " + line for line in term_lines),
            f"        w[j] += {term};",
            "      }",
            "    }",
            "  }",
            "}",
        ]
    return lines


def _cpu_tiled_rows(plan: Plan, sums: int, row_body: list[str], wide_pass: list[str]) -> list[str]:
    """Every output row over every j, for a plan whose wide sums come from _cpu_wide_pass: OpenMP over tiles
    of rows of one batch; a tile first computes its rows' wide sums at every j (one read of y per tile
    instead of per row: read per row, a D = 2048 L1 distance streamed y's 16 MB from memory for each of
    4,000 rows), then runs each row's cells (row_body) reading them (``wt``); ``sums``: how many."""
    pointers = [
        f"const T* g{k} = args[{k}] + b * bstride[{k}];"
        if plan.role(k) == "inner"
        else f"const T* a{k} = args[{k}] + b * bstride[{k}];"
        for k in range(len(plan.arg_cats))
    ]
    return [
        "const int64_t n_terms = n_inner, g_stride = n_inner;",
        f"const int64_t wide_bytes = {sums} * std::max<int64_t>(1, n_terms) * (int64_t)sizeof(T);",
        f"const int64_t tile_rows = std::max<int64_t>(1, std::min<int64_t>({CPU_WIDE_ROWS}, "
        f"{CPU_WIDE_BYTES} / wide_bytes));",
        "const int64_t tiles_per_batch = (n_outer + tile_rows - 1) / tile_rows;",
        "#pragma omp parallel num_threads(nthreads)",
        "{",
        f"  std::vector<T> wbuf({sums} * tile_rows * n_terms);",
        "  const int64_t wt_stride = tile_rows * n_terms;",
        "#pragma omp for schedule(dynamic, 1)",
        "  for (int64_t t = 0; t < nbatch * tiles_per_batch; ++t) {",
        "    const int64_t b = t / tiles_per_batch, i0 = (t - b * tiles_per_batch) * tile_rows;",
        "    const int64_t nr = std::min<int64_t>(tile_rows, n_outer - i0);",
        *("    " + line for line in pointers),
        *("    " + line for line in wide_pass),
        "    for (int64_t r = 0; r < nr; ++r) {",
        "      const int64_t i = i0 + r, row = b * n_outer + i;",
        "      const T* const wt = wbuf.data() + r * n_terms;",
        *("      " + line for line in row_body),
        "    }",
        "  }",
        "}",
    ]


def _cpu_ranged_rows(plan: Plan, row_body: list[str]) -> list[str]:
    """A ranged plan (block_sparse.py; no batch): OpenMP over chunks (row lo, row hi, segment) of one segment's
    rows (block_sparse.segment_rows). A chunk first gathers the inner variables of its segment's ranges into a
    contiguous (D, g_stride) buffer per variable (g_stride: n_terms rounded up to whole groups of lanes, the
    rest zeros), and their indices into jmap, so its rows run the dense loops (vectorised) over the segment's
    n_terms terms however short its ranges, the last group too (over the zeros, only its terms kept)."""
    inner = [k for k in range(len(plan.arg_cats)) if plan.role(k) == "inner"]
    width = sum(plan.arg_dims[k] for k in inner)
    gather, offset = [], 0
    for k in inner:
        d = plan.arg_dims[k]
        gather += [
            f"T* const g{k} = gathered.data() + {offset} * g_stride;",
            f"for (int c = 0; c < {d}; ++c) {{",
            "  int64_t p = 0;",
            "  for (int64_t q = offsets[seg]; q < offsets[seg + 1]; ++q) {",
            "    const int64_t lo = ranges[2 * q], len = ranges[2 * q + 1] - lo;",
            f"    std::memcpy(g{k} + c * g_stride + p, args[{k}] + c * n_inner + lo, len * sizeof(T));",
            "    p += len;",
            "  }",
            "}",
        ]
        offset += d
    return [
        "const int64_t b = 0;",
        "#pragma omp parallel num_threads(nthreads)",
        "{",
        f"  std::vector<T> gathered;  // the chunk's inner variables, {width} rows of g_stride",
        "  std::vector<int32_t> jmap_store;  // the global index of each gathered term",
        "#pragma omp for schedule(dynamic, 1)",
        "  for (int64_t chunk = 0; chunk < n_chunks; ++chunk) {",
        "    const int64_t row_lo = chunks[3 * chunk], row_hi = chunks[3 * chunk + 1], seg = chunks[3 * chunk + 2];",
        "    int64_t n_terms = 0;",
        "    for (int64_t q = offsets[seg]; q < offsets[seg + 1]; ++q) n_terms += ranges[2 * q + 1] - ranges[2 * q];",
        "    const int64_t g_stride = (n_terms + kLanes - 1) / kLanes * kLanes;",
        f"    gathered.assign({max(1, width)} * g_stride + 1, T(0));",
        "    jmap_store.resize(n_terms + 1);",
        "    {",
        "      int64_t p = 0;",
        "      for (int64_t q = offsets[seg]; q < offsets[seg + 1]; ++q)",
        "        for (int64_t j = ranges[2 * q]; j < ranges[2 * q + 1]; ++j)",
        "          jmap_store[p++] = static_cast<int32_t>(j);",
        "    }",
        "    const int32_t* const jmap = jmap_store.data();",
        *("    " + line for line in gather),
        "    for (int64_t i = row_lo; i < row_hi; ++i) {",
        "      const int64_t row = i;",
        *("      " + line for line in row_body),
        "    }",
        "  }",
        "}",
    ]


@dataclass(frozen=True)
class Cells:
    """The cell's statements as the CPU loops place them: in a lane of a group (``lane``), for one j
    (``scalar``), and before a group's lanes (``group``: the wide sums' loops, wide.py; empty without)."""

    lane: list[str]
    scalar: list[str]
    group: list[str]


def _cpu_lanes_loop(cells: Cells, barrier: list[str], scalar: bool, index: str, padded: bool) -> list[str]:
    """The j loop of cpu_source over [0, n_terms) with one reducer per lane, merged into ``red`` at the end
    (module docstring); ``index``: the global index of term j. ``padded``: the inner variables are readable
    up to the next whole group (a ranged plan's gathered buffers), so the tail is one vectorised group whose
    cells are then handed to lane 0 for the terms that exist."""
    if scalar:
        body = [
            "const int64_t full = n_terms - n_terms % kLanes;  // j of the full groups go to lane j % kLanes",
            "for (int64_t j = 0; j < n_terms; ++j) {",
            *("  " + line for line in barrier + cells.scalar),
            f"  lane[j < full ? j % kLanes : 0].add(cf, {index});",
            "  if (Reducer::kBlockSum && j % kBlockTerms == kBlockTerms - 1) fold(lane, total);",
            "}",
        ]
    else:
        body = [
            "int64_t j0 = 0;",
            "for (; j0 + kLanes <= n_terms; j0 += kLanes) {",
            *("  " + line for line in cells.group),
            "  for (int l = 0; l < kLanes; ++l) {",
            "    const int64_t j = j0 + l;",
            *("    " + line for line in cells.lane),
            f"    lane[l].add(cf, {index});",
            "  }",
            "  if (Reducer::kBlockSum && (j0 + kLanes) % kBlockTerms == 0) fold(lane, total);",
            "}",
        ]
        tail = [
            "for (int64_t j = j0; j < n_terms; ++j) {  // the tail, in lane 0 (its j stay increasing)",
            *("  " + line for line in cells.scalar),
            f"  lane[0].add(cf, {index});",
            "}",
        ]
        if padded:
            tail = [
                "if (j0 < n_terms) {  // the tail: a whole group over the padding, its terms to lane 0",
                "  T cbuf[Reducer::kIn * kLanes];",
                *("  " + line for line in cells.group),
                "  for (int l = 0; l < kLanes; ++l) {",
                "    const int64_t j = j0 + l;",
                *("    " + line for line in cells.lane),
                "    for (int d = 0; d < Reducer::kIn; ++d) cbuf[d * kLanes + l] = cf[d];",
                "  }",
                "  for (int64_t j = j0; j < n_terms; ++j) {",
                "    T cf[Reducer::kIn];",
                "    for (int d = 0; d < Reducer::kIn; ++d) cf[d] = cbuf[d * kLanes + (j - j0)];",
                f"    lane[0].add(cf, {index});",
                "  }",
                "}",
            ]
        body += tail
    return [
        "Reducer lane[kLanes], total[Reducer::kBlockSum ? kLanes : 1];  // total: the lanes' finished blocks",
        "for (int l = 0; l < kLanes; ++l) lane[l].init();",
        "if (Reducer::kBlockSum) for (int l = 0; l < kLanes; ++l) total[l].init();",
        *body,
        "if (Reducer::kBlockSum) fold(lane, total);",
        "Reducer& red = Reducer::kBlockSum ? total[0] : lane[0];",
        "Reducer* lanes = Reducer::kBlockSum ? total : lane;",
        "for (int l = 1; l < kLanes; ++l) red.merge(lanes[l]);",
    ]


def _cpu_kbest_loop(cells: Cells, barrier: list[str], scalar: bool, index: str, group_index: str) -> list[str]:
    """The j loop of cpu_source for the k-best: one reducer ``red`` (one sorted list per component) fed in
    increasing j. The vectorised form computes a group of kLanes terms into a buffer, by component, and hands
    it to add_lanes, whose one vector compare against the K-th values rejects most groups whole. ``index``: the
    global index of term j; ``group_index``: add_lanes' indices of the group at j0."""
    if scalar:
        body = [
            "for (int64_t j = 0; j < n_terms; ++j) {",
            *("  " + line for line in barrier + cells.scalar),
            f"  red.add(cf, {index});",
            "}",
        ]
    else:
        body = [
            "int64_t j0 = 0;",
            "for (; j0 + kLanes <= n_terms; j0 += kLanes) {",
            "  T cbuf[Reducer::kIn * kLanes];  // cbuf[d * kLanes + l]: component d of the term at j0 + l",
            *("  " + line for line in cells.group),
            "#pragma GCC unroll 1  // g++ vectorises the loop, not its unrolled copy (seen beside long insertions)",
            "  for (int l = 0; l < kLanes; ++l) {",
            "    const int64_t j = j0 + l;",
            *("    " + line for line in cells.lane),
            "    for (int d = 0; d < Reducer::kIn; ++d) cbuf[d * kLanes + l] = cf[d];",
            "  }",
            f"  red.add_lanes<kLanes>(cbuf, {group_index});",
            "}",
            "for (int64_t j = j0; j < n_terms; ++j) {  // the tail",
            *("  " + line for line in cells.scalar),
            f"  red.add(cf, {index});",
            "}",
        ]
    return ["Reducer red;", "red.init();", *body]


# ---------------------------------------------------------------- CUDA


@dataclass(frozen=True)
class CudaConfig:
    """The policy of the CUDA kernel: threads per block, output rows per thread, j per shared tile, and
    cells per reducer call (``chunk`` > 1: consecutive j handed to the reducer's add_chunk together)."""

    block: int = 256
    rows: int = 2
    tile: int = 256
    chunk: int = 1


# output rows per thread of the k-best: 1 ran 1.2-1.6x faster than 2 with the former reducer (H100, K=10);
# not re-measured with csrc/lazy/kbest.h, whose chunked j loop is the min's plus one branch per 4 terms
# (benchmarks/lazy_kbest.py --kbest-rows N times other values)
KBEST_MAX_ROWS = 1
ROW_REGISTER_BUDGET = 72  # 32-bit registers per thread for the rows' own values and reducers (H100-tuned)
# formula nodes in all the copies of the cell a CUDA kernel holds (rows per thread, chunked loop): a formula
# of thousands of nodes gets one copy, so the source and NVRTC's time stay linear in the formula's size
CELL_COPIES_BUDGET = 4096


def row_registers(plan: Plan, dtype_name: str, chunk: int) -> int:
    """32-bit registers one output row holds for the whole j loop: its outer variables, its reducer's state
    and, when chunked, the chunk's cell values (an estimate that decides the rows per thread)."""
    r, fdim = plan.reduction, plan.formula.dim
    outer = sum(plan.arg_dims[k] for k in range(len(plan.arg_cats)) if plan.role(k) == "outer")
    if r.kind == "kbest":
        state = (2 * r.k + 1) * fdim  # the list (value, index) and its K-th value
    elif r.kind == "weighted_lse":
        state = fdim
    else:
        state = fdim * (2 if r.semiring == "log" or plan.with_arg else 1)
    words = 2 if dtype_name == "float64" else 1
    return (outer + state + (chunk * fdim if chunk > 1 else 0)) * words


# cells per k-best reducer call, and so matrix entries a routed k-best's thread has in flight (the chunk's loads
# come first). H200, 50,000^2 k-NN, ms at 4 / 8 / 16: D = 3 (plain kernel) 2.57 / 2.44 / 2.28, D = 16 4.97 / 4.75 /
# 4.49, D = 128 (routed) 13.26 / 11.89 / 11.87, D = 784 40.13 / 37.21 / 37.88 (docs/perf_notes.md); 16 cells
# are twice the source of 8 for NVRTC
KBEST_CHUNK = 8


def chunk_size(plan: Plan) -> int:
    """Cells per reducer call: KBEST_CHUNK for the k-best (one branch per chunk of compares against the K-th
    value; not ranged: the chunked k-best takes consecutive indices, and a ranged plan's terms need not be), 4
    for logsumexp (one rescale of the running sum per 4 terms), else 1."""
    r = plan.reduction
    if r.kind == "kbest" and not plan.ranged:
        return KBEST_CHUNK
    return 4 if r.kind == "semiring" and r.semiring == "log" else 1


def cuda_config(plan: Plan, dtype_name: str, max_rows: int = 8) -> CudaConfig:
    """The most rows per thread (up to ``max_rows``) whose values fit ROW_REGISTER_BUDGET: each tile row read
    from shared memory then serves that many cells, which takes the loads and the loop's bookkeeping off
    the issue slots of the (FP32- and MUFU-bound) inner loop."""
    chunk = chunk_size(plan)
    nodes = node_count(plan.formula)
    if nodes * (chunk + 1) > CELL_COPIES_BUDGET:
        chunk = 1  # the chunked loop is `chunk` more copies of the cell per row
    per_row = row_registers(plan, dtype_name, chunk)
    if plan.reduction.kind == "kbest":
        max_rows = KBEST_MAX_ROWS
    rows = max_rows
    copies = chunk + 1 if chunk > 1 else 1
    while rows > 1 and (rows * per_row > ROW_REGISTER_BUDGET or rows * copies * nodes > CELL_COPIES_BUDGET):
        rows //= 2
    layout = chunk_layout(plan)
    if layout is None:
        return CudaConfig(rows=rows, chunk=chunk)
    # chunked wide sums: their running sums, (sums, tile, rows, block) in shared memory, within WIDE_SUMS_BYTES
    size = 8 if dtype_name == "float64" else 4
    block = WIDE_BLOCK
    while block > 32 and len(layout.terms) * WIDE_TILE * block * size > WIDE_SUMS_BYTES:
        block //= 2
    while rows > 1 and len(layout.terms) * WIDE_TILE * block * rows * size > WIDE_SUMS_BYTES:
        rows //= 2
    return CudaConfig(block=block, rows=rows, chunk=chunk)


_chunk_layouts: dict[str, ChunkLayout | None] = {}
MAX_CHUNK_LAYOUTS = 4096  # plans' layouts remembered (the cache is cleared past this)


def chunk_layout(plan: Plan) -> ChunkLayout | None:
    """The plan's wide sums as computed apart from the cells: by the CUDA kernel in chunks (wide_chunks.py), by
    the CPU kernel over tiles of rows (_cpu_tiled_rows); None without any, or when a sum's terms read a routed
    plan's inner product (those keep a loop per cell)."""
    if plan.key in _chunk_layouts:
        return _chunk_layouts[plan.key]
    if len(_chunk_layouts) >= MAX_CHUNK_LAYOUTS:
        _chunk_layouts.clear()
    formula = strength_reduce(plan.formula, _invariant(plan))  # the cell's formula, as _cell has it
    if plan.grams:
        grams = [node for node in _postorder(formula) if isinstance(node, InnerProduct)]
        formula = replace_nodes(formula, {id(node): _gram_placeholder(node) for node in grams})
    found = find_wide_sums(formula, _is_inner(plan))
    terms = [node.children[0] for node in found]
    terms_vars = [v for x in terms for v in _postorder(x) if isinstance(v, Var)]
    layout = None
    if terms_vars and all(v.slot < WIDE_SLOT for v in terms_vars):
        outside = {v.slot for v in _postorder(formula, {id(node) for node in found}) if isinstance(v, Var)}
        wide_inner = {v.slot for v in terms_vars if v.dim > 1 and plan.role(v.slot) == "inner"}
        layout = ChunkLayout(tuple(terms), tuple(sorted(wide_inner - outside)))
    _chunk_layouts[plan.key] = layout
    return layout


def inner_layout(plan: Plan, dtype_name: str) -> tuple[dict[int, int], int]:
    """Offsets of the inner variables staged whole in a shared-memory row (not those staged by chunks,
    wide_chunks.py), and the row stride (padded to 16 bytes)."""
    offsets: dict[int, int] = {}
    total = 0
    layout = chunk_layout(plan)
    chunked = layout.chunked if layout is not None else ()
    for k in staged_inner_slots(plan):
        if k in chunked:
            continue
        offsets[k] = total
        total += plan.arg_dims[k]
    per16 = 4 if dtype_name == "float32" else 2
    stride = max(per16, -(-total // per16) * per16) if total else per16
    return offsets, stride


def cuda_tile(plan: Plan, dtype_name: str, cfg: CudaConfig) -> int:
    """j per shared tile: cfg.tile, fewer when the rows are wide (at most 48 KiB of static shared memory,
    with a ranged plan's int32 index per term), at most WIDE_TILE with chunked wide sums."""
    _, stride = inner_layout(plan, dtype_name)
    size = 4 if dtype_name == "float32" else 8
    per_j = stride * size + (4 if plan.ranged else 0)
    layout = chunk_layout(plan)
    if layout is None:
        return max(1, min(cfg.tile, (48 * 1024) // per_j))
    # chunked wide sums: their chunks (tile, WIDE_CHUNK) and running sums (sums, tile, rows, block) per j too
    per_j += size * (WIDE_CHUNK * len(layout.chunked) + len(layout.terms) * cfg.rows * cfg.block)
    return max(1, min(cfg.tile, WIDE_TILE, (48 * 1024) // per_j))


# threads per block of lazy_merge, also its launch bound: without one, a full compile that takes more registers
# than the quick one (nvrtc.py's tiers) allows fewer threads per block, and the quick module refused to adopt it
MERGE_BLOCK = 256
GRAM_PREFETCH = 16  # matrix entries a thread of a routed plan's CUDA loop loads before computing their cells
# ... of a routed k-best, whose cells are compare-bound and large: each entry in flight is one more copy of the
# K-list insertion for NVRTC (H200, D = 784, 50,000^2 k-NN: 40.3 ms at 16 and at 2; a new formula's first call
# 1.86 s at 16, 0.62 s at 2; the Gaussian K @ b needs the 16 at D = 128: 11.0 ms against 13.9 at 2)
KBEST_GRAM_PREFETCH = 2


def gram_prefetch(plan: Plan, rows: int, count: int, guard: bool) -> list[str]:
    """A routed plan's CUDA statements loading the matrix entries of ``count`` consecutive j from j0 + jj for
    each of the thread's rows, before the cells that read them (``gq{n}_r{r}[uq]``): one load per cell and
    nothing else to wait on, so a warp keeps ``count`` loads in flight instead of one (the entries stream from
    memory once: the loop is bound by their latency otherwise). ``guard``: only j < nt (the tail)."""
    lines = []
    for r in range(rows):
        for n in range(plan.grams):
            at = f"gram{n}[(long long)(j0 + jj + u) * n_outer + i{r}]"
            lines += [
                f"T gq{n}_r{r}[{count}];",
                "#pragma unroll",
                f"for (int u = 0; u < {count}; ++u) gq{n}_r{r}[u] = {f'jj + u < nt ? {at} : T(0)' if guard else at};",
            ]
    return lines


def cuda_source(plan: Plan, dtype_name: str, cfg: CudaConfig) -> str:
    """Kernels lazy_reduce (both schemes), lazy_merge (the 2-D scheme's merge) and lazy_sizeof. lazy_reduce
    takes (vals, idx, partial, a0 .. a{n-1}, [nums, when the plan has numbers,] [chunks, offsets, ranges,
    firsts, when it is ranged,] bs0 .. bs{n-1}, n_outer, n_inner, blocks_per_batch, j_per_block, rows_total).

    A ranged plan's block (x, y) reduces the rows [chunks[x][0], chunks[x][1]) of segment s = chunks[x][2]
    (block_sparse.segment_rows: rows of one segment, so the whole block walks the same terms) over part y of
    gridDim.y of the segment's terms (the 2-D scheme when gridDim.y > 1). The terms are the inner ranges q in
    [offsets[s], offsets[s + 1]) (its RangeMap's) laid end to end: term p lies in the range q with
    firsts[q] <= p < firsts[q + 1] (firsts: the ranges' cumulative lengths).
    A tile stages the next ``tile`` terms however short the ranges, each thread finding its terms' ranges by
    binary search and writing their indices to tile_j, then the variables' rows from them."""
    offsets, stride = inner_layout(plan, dtype_name)
    tile = cuda_tile(plan, dtype_name, cfg)
    layout = chunk_layout(plan)
    slots = range(len(plan.arg_cats))
    params = [f"const T* __restrict__ a{k}" for k in slots]
    if plan.n_numbers:
        params.append("const T* __restrict__ nums")  # the number vector, after the variables
    for n in range(plan.grams):  # a routed plan's matrices (plan.CallArgs.grams; the matrix (n_inner, n_outer))
        params += [f"const T* __restrict__ {name}{n}" for name in ("gram", "xnorm", "ynorm")]
    if plan.ranged:
        params += [f"const long long* __restrict__ {name}" for name in ("chunks", "offsets", "ranges", "firsts")]
    sig_args = ", ".join([*params, *(f"long long bs{k}" for k in slots)])
    head = [f"const T* p{k} = a{k} + b * bs{k};" for k in slots]
    for k in slots:
        d = plan.arg_dims[k]
        if plan.role(k) == "param":
            head += [f"const T v{k}_{c} = p{k}[{c}];" for c in range(d)]
    staging = []
    if plan.ranged:  # the tile's terms' indices first (see the docstring)
        staging += [
            f"for (int t = threadIdx.x; t < nt; t += {cfg.block}) {{",
            "  const long long p = j0 + t;",
            "  long long lo = q0, hi = q1;  // the last range q in [q0, q1) with firsts[q] <= p",
            "  while (hi - lo > 1) {",
            "    const long long mid = (lo + hi) >> 1;",
            "    if (firsts[mid] <= p) lo = mid; else hi = mid;",
            "  }",
            "  tile_j[t] = (int32_t)(ranges[2 * lo] + (p - firsts[lo]));",
            "}",
            "__syncthreads();",
        ]
    for k, off in offsets.items():
        d = plan.arg_dims[k]
        source = f"p{k}[(long long)tile_j[jj] * {d} + (t - jj * {d})]" if plan.ranged else f"p{k}[j0 * {d} + t]"
        staging.append(
            f"for (int t = threadIdx.x; t < nt * {d}; t += {cfg.block}) {{ const int jj = t / {d}; "
            f"tile[jj * {stride} + {off} + (t - jj * {d})] = {source}; }}"
        )
    cells: list[list[str]] = []
    hoisted_rows: list[str] = []  # after every row's loads, as the rows' cells read them
    for r in range(cfg.rows):
        used: set[tuple[int, int]] = set()  # the (slot, component) of row r's variables the cell reads

        def read(var: Var, c: int, r: int = r, used: set = used) -> str:
            role = plan.role(var.slot)
            if role == "inner":
                return f"row[{offsets[var.slot] + c}]"
            if role == "outer":
                used.add((var.slot, c))
                return f"v{var.slot}_r{r}_{c}"
            return f"v{var.slot}_{c}"

        def read_at(var: Var, d: str, r: int = r) -> str:  # component d (a C expression): wide sums' loops
            role = plan.role(var.slot)
            if role == "inner":  # staged, or read where a routed plan's squared distance cancels
                at = offsets.get(var.slot)
                return f"row[{at} + ({d})]" if at is not None else f"p{var.slot}[(long long)j * {var.dim} + ({d})]"
            return f"p{var.slot}[i{r} * {var.dim} + ({d})]" if role == "outer" else f"p{var.slot}[{d}]"

        number = lambda k, hoisted: f"nums[{k}]" if hoisted else f"numsj[{k}]"  # noqa: E731
        grams = GramReads(  # the matrix entries come prefetched (gram_prefetch), entry uq of the group
            lambda n, r=r: f"gq{n}_r{r}[uq]",
            lambda n, r=r: f"xnorm{n}[i{r}]",
            lambda n: f"ynorm{n}[j]",
        )
        read_sum = (lambda n, r=r: sum_entry(n, r, tile, cfg.rows, cfg.block)) if layout else None
        hoisted, cell, wide = _cell(plan, read, read_at, f"r{r}_", number, grams, read_sum)
        head.append(f"const long long i{r} = min(i_base + {r * cfg.block}LL, row_hi - 1);")
        head += [f"const T v{k}_r{r}_{c} = p{k}[i{r} * {plan.arg_dims[k]} + {c}];" for k, c in sorted(used)]
        hoisted_rows += hoisted
        cells.append([*wide.scalar, *cell])
    head += hoisted_rows
    # chunked wide sums (wide_chunks.py): their phase in each tile, their shared arrays, a cell's tile position
    wide_phase: list[str] = []
    wide_shared: list[str] = []

    def jq(at: str) -> list[str]:
        return [f"const int jq = {at};  // the tile position of j (its wide sums)"] if layout is not None else []

    if layout is not None:
        staged = lambda var, d: f"tile[u * {stride} + {offsets[var.slot]} + ({d})]"  # noqa: E731
        j_of = (lambda u: f"tile_j[{u}]") if plan.ranged else (lambda u: f"j0 + {u}")
        kernel = ChunkKernel(plan, layout, cfg.rows, tile, cfg.block, dtype_name, staged, j_of)
        head += alignment_flags(kernel)
        wide_shared = [f"__shared__ __align__(16) T wch{k}[{tile * WIDE_CHUNK}];" for k in layout.chunked]
        wide_shared.append(f"__shared__ T wsum[{len(layout.terms) * tile * cfg.rows * cfg.block}];")
        wide_phase = chunk_phase(kernel)
    body: list[str] = []
    for r, cell in enumerate(cells):
        body += ["{", *("  " + s for s in cell), f"  red[{r}].add(r{r}_f, j);", "}"]
    large = node_count(plan.formula) > LARGE_FORMULA_NODES
    # numsj: the number vector, opaque per j in a large formula (loads stay where they are used)
    numsj = 'const T* numsj = nums; asm volatile("" : "+l"(numsj));' if large else "const T* numsj = nums;"
    if plan.grams:  # groups of j whose matrix entries are loaded first, GRAM_PREFETCH in flight per thread
        group = max(2, (KBEST_GRAM_PREFETCH if plan.reduction.kind == "kbest" else GRAM_PREFETCH) // cfg.rows)
        loops = [
            "#pragma unroll 1",
            f"for (; jj < nt; jj += {group}) {{",
            *("  " + s for s in gram_prefetch(plan, cfg.rows, group, True)),
            "#pragma unroll",
            f"  for (int uq = 0; uq < {group}; ++uq) {{",
            "    if (jj + uq >= nt) break;",
            *("    " + s for s in jq("jj + uq")),
            f"    const T* row = tile + (jj + uq) * {stride};",
            "    const int32_t j = (int32_t)(j0 + jj + uq);",
            *(["    " + numsj] if plan.n_numbers else []),
            *("    " + s for s in body),
            "  }",
            "}",
        ]
    else:
        loops = [
            "#pragma unroll 1" if large else "#pragma unroll 4",
            "for (; jj < nt; ++jj) {",
            f"  const T* row = tile + jj * {stride};",
            *("  " + s for s in jq("jj")),
            "  const int32_t j = tile_j[jj];" if plan.ranged else "  const int32_t j = (int32_t)(j0 + jj);",
            *(["  " + numsj] if plan.n_numbers else []),
            *("  " + s for s in body),
            "}",
        ]
    if cfg.chunk > 1:
        # (its indices j0 + jj, j0 + jj + 1, ...: a ranged plan chunks only reductions that use none, logsumexp)
        u_max, fdim = cfg.chunk, plan.formula.dim
        chunked = []
        for r, cell in enumerate(cells):
            chunked += [f"T r{r}_c[{u_max * fdim}];"]
            for u in range(u_max):
                copy = [f"r{r}_c[{u * fdim + c}] = r{r}_f[{c}];" for c in range(fdim)]
                chunked += ["{", f"  const T* row = tile + (jj + {u}) * {stride};"]
                chunked += ["  " + s for s in jq(f"jj + {u}")]
                chunked += (
                    [f"  const int32_t j = (int32_t)(j0 + jj + {u});", f"  const int uq = {u};"] if plan.grams else []
                )
                chunked += ["  " + s for s in cell]
                chunked += ["  " + " ".join(copy), "}"]
            chunked.append(f"red[{r}].add_chunk<{u_max}>(r{r}_c, (int32_t)(j0 + jj));")
        chunked = [numsj, *chunked] if plan.n_numbers else chunked
        chunked = [*gram_prefetch(plan, cfg.rows, u_max, False), *chunked]
        loops = [f"for (; jj + {u_max} <= nt; jj += {u_max}) {{", *("  " + s for s in chunked), "}", *loops]
    if plan.ranged:
        block_rows = [
            "const long long* chunk = chunks + 3LL * blockIdx.x;",
            "const long long b = 0, row_lo = chunk[0], row_hi = chunk[1], seg = chunk[2];",
            "(void)blocks_per_batch; (void)j_per_block;",
        ]
        range_open = [
            "{",
            "const long long q0 = offsets[seg], q1 = offsets[seg + 1];",
            "// part blockIdx.y of gridDim.y of the segment's terms, in whole tiles (j0: a tile's first position p)",
            "const long long per_part = (firsts[q1] - firsts[q0] + gridDim.y - 1) / gridDim.y;",
            f"const long long per = (per_part + {tile - 1}) / {tile} * {tile};",
            "const long long j_begin = firsts[q0] + blockIdx.y * per, j_end = min(firsts[q1], j_begin + per);",
            f"__shared__ int32_t tile_j[{tile}];",
        ]
        range_close = ["}"]
    else:
        block_rows = [
            "const long long b = blockIdx.x / blocks_per_batch;",
            f"const long long row_lo = (blockIdx.x - b * blocks_per_batch) * {cfg.block * cfg.rows}LL;",
            "const long long row_hi = n_outer;",
        ]
        range_open = [
            "{",
            "const long long j_begin = (long long)blockIdx.y * j_per_block;",
            "const long long j_end = min(n_inner, j_begin + j_per_block);",
        ]
        range_close = ["}"]
    stores = []
    for r in range(cfg.rows):
        idx_expr = f"idx + row * {plan.index_dim}" if plan.index_dim else "nullptr"
        stores.append(
            f"if (i_base + {r * cfg.block}LL < row_hi) {{ const long long row = b * n_outer + i_base + "
            f"{r * cfg.block}LL; if (partial) partial[(long long)blockIdx.y * rows_total + row] = red[{r}]; "
            f"else red[{r}].store(vals + row * {plan.value_dim}, {idx_expr}); }}"
        )
    return (
        _prelude(plan, dtype_name, "cuda")
        + f"""
extern "C" __global__ void lazy_sizeof(long long* out) {{ *out = sizeof(Reducer); }}

extern "C" __global__ void __launch_bounds__({cfg.block}) lazy_reduce(
    T* __restrict__ vals, int64_t* __restrict__ idx, Reducer* __restrict__ partial, {sig_args},
    long long n_outer, long long n_inner, long long blocks_per_batch, long long j_per_block, long long rows_total) {{
  __shared__ __align__(16) T tile[{tile * stride}];
{_indent(wide_shared, 2) + chr(10) if wide_shared else ""}{_indent(block_rows, 2)}
  const long long i_base = row_lo + threadIdx.x;
  const bool live = row_lo + (long long)(threadIdx.x & ~31u) < row_hi;  // warp-uniform
{_indent(head, 2)}
  Reducer red[{cfg.rows}], total[Reducer::kBlockSum ? {cfg.rows} : 1];  // total: the finished blocks (reducers.h)
#pragma unroll
  for (int r = 0; r < {cfg.rows}; ++r) red[r].init();
  if (Reducer::kBlockSum)
#pragma unroll
    for (int r = 0; r < {cfg.rows}; ++r) total[r].init();
{_indent(range_open, 2)}
  for (long long j0 = j_begin; j0 < j_end; j0 += {tile}) {{
    const int nt = (int)min((long long){tile}, j_end - j0);
    __syncthreads();
{_indent(staging, 4)}
    __syncthreads();
{_indent(wide_phase, 4) + chr(10) if wide_phase else ""}    int jj = 0;
    if (live)  // a warp none of whose rows exist stages with the block but computes nothing
    {{
{_indent(loops, 6)}
    }}
    if (Reducer::kBlockSum)  // a block of a block sum per tile
#pragma unroll
      for (int r = 0; r < {cfg.rows}; ++r) {{
        total[r].merge(red[r]);
        red[r].init();
      }}
  }}
{_indent(range_close, 2)}
  if (Reducer::kBlockSum)
#pragma unroll
    for (int r = 0; r < {cfg.rows}; ++r) red[r] = total[r];
{_indent(stores, 2)}
}}

extern "C" __global__ void __launch_bounds__({MERGE_BLOCK}) lazy_merge(T* __restrict__ vals, int64_t* __restrict__ idx,
                                      const Reducer* __restrict__ partial, long long rows_total, int nsplit) {{
  const long long row = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (row >= rows_total) return;
  Reducer r = partial[row];
  for (int s = 1; s < nsplit; ++s) r.merge(partial[(long long)s * rows_total + row]);
  r.store(vals + row * {plan.value_dim}, {"idx + row * " + str(plan.index_dim) if plan.index_dim else "nullptr"});
}}
"""
    )
