"""The CUDA kernel's wide sums (wide.py) in chunks of components, a tile of j at a time (KeOps's chunked mode).

A sum of more than ``formula.WIDE_COMPONENTS`` components (``((x_i - y_j).abs()).sum(-1)`` at D = 784) cannot keep
its variables in registers as the unrolled cell does. Read per cell from global memory, x_i costs D scattered
loads per cell (a 70x cliff between D = 64 and 128, issue 42). Instead, for each tile of ``tile`` j the block
walks the components in chunks of WIDE_CHUNK:

- the chunk of every inner variable read only by the wide sums is staged in shared memory (``wch{k}``,
  (tile, WIDE_CHUNK), read by all the threads at once: a broadcast);
- each thread loads the chunk of its rows' outer variables (and of the parameters) into registers, with
  16-byte loads where the rows are aligned;
- for each j of the tile it adds the chunk's terms to its running sum, kept in shared memory
  (``wsum``: (sums, tile, rows, block), each thread its own entries, no synchronisation), loaded into a
  register for the chunk and stored back.

The cells then read their sums from ``wsum`` (wide.wide_sums' ``read_sum``). The terms are added in increasing
d from 0, as in the unrolled sum and the CPU's loops. The generated code is a loop over chunks: its size does
not grow with D.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from .formula import Formula, Var, _postorder
from .plan import Plan
from .wide import component_term

__all__ = [
    "WIDE_BLOCK",
    "WIDE_CHUNK",
    "WIDE_SUMS_BYTES",
    "WIDE_TILE",
    "ChunkKernel",
    "ChunkLayout",
    "alignment_flags",
    "chunk_phase",
    "sum_entry",
]

WIDE_TILE = 32  # j per tile of a plan with chunked wide sums: the outer chunk in registers serves this many j
WIDE_CHUNK = 16  # components per chunk (an unrolled loop of this many terms per j)
WIDE_BLOCK = 128  # threads per block of such a plan (its running sums live in shared memory)
WIDE_SUMS_BYTES = 32 * 1024  # shared memory for the running sums at most (fewer rows per thread beyond)


@dataclass(frozen=True)
class ChunkLayout:
    """A plan's wide sums as the CUDA kernel computes them: ``terms[n]`` is the summed formula of wide sum n
    (wide.WideSums.terms), ``chunked`` the inner variables staged by chunks (read by the wide sums alone)."""

    terms: tuple[Formula, ...]
    chunked: tuple[int, ...]

    def dims(self) -> list[int]:
        """The sums' numbers of components, each once, in order."""
        return list(dict.fromkeys(x.dim for x in self.terms))


def sum_entry(n: int, r: int, tile: int, rows: int, block: int, j: str = "jq") -> str:
    """The shared-memory entry holding wide sum n of row r at tile position ``j`` (a C expression)."""
    return f"wsum[(({n} * {tile} + {j}) * {rows} + {r}) * {block} + threadIdx.x]"


def _vars(x: Formula) -> list[Var]:
    return [node for node in _postorder(x) if isinstance(node, Var)]


def _per16(dtype_name: str) -> int:
    """Values per 16-byte load."""
    return 4 if dtype_name == "float32" else 2


@dataclass(frozen=True)
class ChunkKernel:
    """What the chunk phase needs of its kernel: the plan and its layout, rows per thread, j per tile, threads
    per block, the dtype; ``staged(var, d)``: component d (a C expression) of an inner variable staged whole at
    tile position ``u``; ``j_of(u)``: the index of tile position u."""

    plan: Plan
    layout: ChunkLayout
    rows: int
    tile: int
    block: int
    dtype_name: str
    staged: Callable[[Var, str], str]
    j_of: Callable[[str], str]


def alignment_flags(k: ChunkKernel) -> list[str]:
    """The kernel's head statements ``xal{slot}``: whether an outer variable or parameter of the wide sums, of a
    whole number of 16-byte groups per row, starts 16-byte aligned (its chunks then take 16-byte loads)."""
    slots = sorted({v.slot for x in k.layout.terms for v in _vars(x) if v.dim > 1})
    return [
        f"const bool xal{slot} = ((unsigned long long)p{slot} & 15) == 0;  // 16-byte loads of its chunks"
        for slot in slots
        if k.plan.role(slot) != "inner" and k.plan.arg_dims[slot] % _per16(k.dtype_name) == 0
    ]


def chunk_phase(k: ChunkKernel) -> list[str]:
    """The statements of one tile's chunk phase, after the tile's staging, run by every thread of the block
    (its synchronisations; only ``live`` warps compute)."""
    chunk = WIDE_CHUNK
    lines = []
    for n in range(len(k.layout.terms)):
        for r in range(k.rows):
            lines += [f"for (int u = 0; u < {k.tile}; ++u) {sum_entry(n, r, k.tile, k.rows, k.block, 'u')} = T(0);"]
    for dim in k.layout.dims():
        sums = [n for n, x in enumerate(k.layout.terms) if x.dim == dim]
        full = dim - dim % chunk
        if full:
            body = _chunk_body(k, sums, dim, chunk)
            lines += [f"for (int d0 = 0; d0 < {full}; d0 += {chunk}) {{", *("  " + s for s in body), "}"]
        if dim % chunk:
            body = _chunk_body(k, sums, dim, dim % chunk)
            lines += ["{", f"  const int d0 = {full};", *("  " + s for s in body), "}"]
    return lines


def _chunk_body(k: ChunkKernel, sums: list[int], dim: int, length: int) -> list[str]:
    """One chunk of ``length`` components from d0 of the wide sums ``sums`` (all of ``dim`` components)."""
    plan, layout, rows, tile, block, dtype_name = k.plan, k.layout, k.rows, k.tile, k.block, k.dtype_name
    staged, j_of = k.staged, k.j_of
    chunk = WIDE_CHUNK
    used = sorted({v.slot for n in sums for v in _vars(layout.terms[n]) if v.dim > 1})
    lines = ["__syncthreads();  // the previous chunk's reads are done"]
    for slot in used:
        if slot in layout.chunked:
            src = f"p{slot}[(long long)({j_of('u')}) * {dim} + d0 + dd]"
            lines += [
                f"for (int t = threadIdx.x; t < {tile * length}; t += {block}) {{",
                f"  const int u = t / {length}, dd = t - u * {length};",
                f"  wch{slot}[u * {chunk} + dd] = u < nt ? {src} : T(0);",
                "}",
            ]
    lines += ["__syncthreads();", "if (live) {"]
    per16 = _per16(dtype_name)
    vector = f"float{per16}" if dtype_name == "float32" else "double2"
    fields = "xyzw"[:per16]
    for slot in used:
        role = plan.role(slot)
        if role == "inner":
            continue
        for r in range(rows if role == "outer" else 1):
            name = f"xc{slot}_r{r}" if role == "outer" else f"pc{slot}"
            at = f"{f'i{r} * {dim} + ' if role == 'outer' else ''}d0"
            lines += [f"  T {name}[{length}];"]
            scalar = ["#pragma unroll", f"for (int dd = 0; dd < {length}; ++dd) {name}[dd] = p{slot}[{at} + dd];"]
            if dim % per16 == 0 and length % per16 == 0:  # 16-byte loads where p{k} is aligned (xal{k})
                loads = [f"{name}[{per16} * q + {c}] = v.{f};" for c, f in enumerate(fields)]
                lines += [
                    f"  if (xal{slot}) {{",
                    "#pragma unroll",
                    f"    for (int q = 0; q < {length // per16}; ++q) {{",
                    f"      const {vector} v = *reinterpret_cast<const {vector}*>(p{slot} + {at} + {per16} * q);",
                    "      " + " ".join(loads),
                    "    }",
                    "  } else {",
                    *("    " + s for s in scalar),
                    "  }",
                ]
            else:
                lines += ["  " + s for s in scalar]
    lines += ["#pragma unroll 1", f"  for (int u = 0; u < {tile}; ++u) {{"]
    for n in sums:
        for r in range(rows):
            lines.append(f"    T s{n}_r{r} = {sum_entry(n, r, tile, rows, block, 'u')};")
    lines += ["#pragma unroll", f"    for (int dd = 0; dd < {length}; ++dd) {{"]
    for n in sums:
        for r in range(rows):

            def read(var: Var, d: str, r: int = r) -> str:
                role = plan.role(var.slot)
                if role == "inner":
                    if var.slot in layout.chunked:
                        return f"wch{var.slot}[u * {chunk} + dd]"
                    return staged(var, "d0 + dd" if d == "d" else d)
                if var.dim == 1:
                    return f"p{var.slot}[i{r}]" if role == "outer" else f"v{var.slot}_0"
                return f"xc{var.slot}_r{r}[dd]" if role == "outer" else f"pc{var.slot}[dd]"

            term_lines, term = component_term(layout.terms[n], read, lambda q: f"nums[{q}]", f"wc{n}_r{r}_")
            lines += ["      {", *("        " + s for s in term_lines), f"        s{n}_r{r} += {term};", "      }"]
    lines += ["    }"]
    for n in sums:
        for r in range(rows):
            lines.append(f"    {sum_entry(n, r, tile, rows, block, 'u')} = s{n}_r{r};")
    lines += ["  }", "}"]
    return lines
