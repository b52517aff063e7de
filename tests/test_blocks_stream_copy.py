"""The block engine's host writes: the CPU extension's stream_copy (streaming stores into a block of rows) and
the condensed scatter's streamed rows against torch's copy / the index_copy fallback, bit for bit, on
poisoned outputs; their input checks; the dense writer's choice between stream_copy and copy_."""

from __future__ import annotations

import pytest
import torch

from semiring_ops.blocks import writers
from semiring_ops.blocks.scheduler import Block
from semiring_ops.blocks.writers import CondensedWriter, DenseWriter, is_row_block

MiB = 1 << 20


@pytest.fixture(scope="module")
def stream_copy():
    fn = writers.compiled_stream_copy()
    if fn is None:
        pytest.skip("the CPU kernels are not compiled here")
    return fn


def _poisoned(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """An output whose every cell is NaN (all ones for integers): a cell not written stays visible."""
    if dtype.is_floating_point:
        return torch.full(shape, float("nan"), dtype=dtype)
    return torch.full(shape, -1, dtype=dtype)


def _random(shape: tuple[int, ...], dtype: torch.dtype, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    if dtype.is_floating_point:
        return torch.randn(shape, generator=g, dtype=dtype) + 3.0  # never zero
    return torch.randint(1, 100, shape, generator=g, dtype=dtype)


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(a.view(torch.uint8), b.view(torch.uint8))


# (out shape, rows, cols): blocks out[rows, cols] of row-major outputs; odd sizes and start columns, so rows
# are not multiples of 32 bytes and start at every alignment
CASES = [
    ((7, 13), slice(1, 6), slice(3, 12)),  # small
    ((5, 1), slice(0, 5), slice(0, 1)),  # one value per row
    ((1, 1001), slice(0, 1), slice(1, 1000)),  # one misaligned row
    ((33, 129, 3), slice(2, 31), slice(5, 128)),  # 3-D: (rows, cols, D)
    ((417, 997), slice(3, 411), slice(1, 990)),  # > 1 MiB: streaming stores, many pieces
    ((131, 409, 5), slice(1, 130), slice(7, 402)),  # 3-D, > 1 MiB
    ((2, 400_001), slice(1, 2), slice(3, 400_000)),  # one row of > 1 MiB
    ((300, 1200), slice(0, 300), slice(0, 1200)),  # the whole (contiguous) output
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize(("shape", "rows", "cols"), CASES)
def test_stream_copy_equals_copy_(stream_copy, shape, rows, cols, dtype):
    out, want = _poisoned(shape, dtype), _poisoned(shape, dtype)
    view = out[rows, cols]
    src = _random(tuple(view.shape), dtype, seed=sum(shape))
    assert is_row_block(view)
    stream_copy(view, src)
    want[rows, cols].copy_(src)
    assert _same_bits(out, want)  # the block written, nothing outside it


@pytest.mark.parametrize("offset", range(8))
@pytest.mark.parametrize("nbytes", [1, 31, 255, 257, 4097, MiB + 129])
def test_stream_copy_at_every_byte_alignment(stream_copy, offset, nbytes):
    out = torch.full((3, nbytes + 16), 0xAB, dtype=torch.uint8)
    want = out.clone()
    src = torch.randint(0, 256, (2, nbytes), dtype=torch.uint8, generator=torch.Generator().manual_seed(nbytes))
    stream_copy(out[1:, offset : offset + nbytes], src)
    want[1:, offset : offset + nbytes] = src
    assert torch.equal(out, want)


@pytest.mark.parametrize("shape", [(0, 5), (4, 0), (0, 0, 3), (3, 2, 0), (0,)])
def test_stream_copy_of_an_empty_block(stream_copy, shape):
    out = _poisoned((6, 7, 3), torch.float32)
    dst = torch.empty(shape)
    stream_copy(dst, torch.empty(shape))
    view = out[:0, :5]
    stream_copy(view, torch.empty(view.shape))
    assert out.isnan().all()


def test_stream_copy_of_contiguous_one_dim_and_scalar_tensors(stream_copy):
    out = _poisoned((MiB // 4 + 7,), torch.float32)
    src = _random((MiB // 4 + 5,), torch.float32, seed=3)
    stream_copy(out[1:-1], src)  # 4 bytes past alignment
    assert torch.equal(out[1:-1], src) and out[0].isnan() and out[-1].isnan()
    scalar = torch.tensor(float("nan"), dtype=torch.float64)
    stream_copy(scalar, torch.tensor(2.5, dtype=torch.float64))
    assert scalar.item() == 2.5


def test_stream_copy_refuses_bad_input(stream_copy):
    out = torch.zeros(8, 10)
    with pytest.raises(RuntimeError, match=r"dst has shape \[2, 3\] and src \[3, 2\]"):
        stream_copy(out[:2, :3], torch.ones(3, 2))
    with pytest.raises(RuntimeError, match="dst is Float and src Double"):
        stream_copy(out[:2, :3], torch.ones(2, 3, dtype=torch.float64))
    with pytest.raises(RuntimeError, match="host tensors only, got dst on cpu and src on meta"):
        stream_copy(out[:2, :3], torch.ones(2, 3, device="meta"))
    with pytest.raises(RuntimeError, match=r"src must be contiguous, got shape \[3, 2\] strides \[1, 3\]"):
        stream_copy(out[:3, :2], torch.ones(2, 3).t())
    with pytest.raises(RuntimeError, match=r"dst must be a block of rows .* shape \[4, 5\] strides \[10, 2\]"):
        stream_copy(out[:4, ::2], torch.ones(4, 5))
    with pytest.raises(RuntimeError, match=r"dst must be a block of rows .* shape \[3, 2\] strides \[1, 10\]"):
        stream_copy(out[:2, :3].t(), torch.ones(3, 2))
    with pytest.raises(RuntimeError, match="dst and src overlap in memory"):
        stream_copy(out[0, :6], out[0, 4:10])
    assert out.eq(0).all()  # nothing written by a refused call


def test_is_row_block():
    out = torch.empty(9, 11, 3)
    assert is_row_block(out[2:5, 3:7]) and is_row_block(out[2:5, 3:7, :]) and is_row_block(out[4:5, 1:2])
    assert not is_row_block(out[2:5, 3:7, :2])  # each row's cells are not one run
    assert not is_row_block(out.transpose(0, 1)) and not is_row_block(out[::2, ::2])
    assert is_row_block(out[::2])  # rows farther apart: fine
    assert not is_row_block(torch.empty(10)[::2]) and is_row_block(torch.empty(10)[3:])
    assert is_row_block(torch.empty(3, 2, 0)) and is_row_block(torch.empty(0, 4).t())  # empty: any strides


def _block(r0: int, r1: int, c0: int, c1: int) -> Block:
    return Block(0, 0, 0, r0, r1, c0, c1, (r1 - r0) * (c1 - c0), False)


@pytest.mark.parametrize("layout", ["row-major", "transposed"])  # stream_copy, or torch's copy_ for any layout
def test_dense_writer_streams_row_blocks_and_copies_other_layouts(layout, monkeypatch):
    calls = []
    compiled = writers.compiled_stream_copy()
    if compiled is None and layout == "row-major":
        pytest.skip("the CPU kernels are not compiled here")
    monkeypatch.setattr(writers, "compiled_stream_copy", lambda: lambda d, s: (calls.append(1), compiled(d, s)))
    m, n = 523, 611  # blocks of > 1 MiB (float64) and small ones
    out = _poisoned((m, n), torch.float64) if layout == "row-major" else _poisoned((n, m), torch.float64).t()
    full = _random((m, n), torch.float64, seed=7)
    writer = DenseWriter(out)
    for r0, r1, c0, c1 in [(0, 300, 0, 611), (300, 523, 0, 5), (300, 523, 5, 611)]:
        writer.write(_block(r0, r1, c0, c1), full[r0:r1, c0:c1].clone())
    assert torch.equal(out, full)
    assert len(calls) == (3 if layout == "row-major" else 0)


@pytest.mark.parametrize("diagonal", [False, True])
def test_condensed_scatter_streams_large_blocks(diagonal, monkeypatch):
    """Blocks of > 1 MiB (the streaming path) across and beside the diagonal, against index_copy_."""
    if writers.compiled_condensed_scatter() is None:
        pytest.skip("the CPU kernels are not compiled here")
    n = 901
    size = n * (n + 1) // 2 if diagonal else n * (n - 1) // 2
    full = _random((n, n, 2), torch.float32, seed=11)  # D = 2: cells of 8 bytes
    blocks = [_block(0, 600, 0, 700), _block(0, 600, 700, 901), _block(600, 901, 300, 901)]
    got, want = _poisoned((size, 2), torch.float32), _poisoned((size, 2), torch.float32)
    for b in blocks:
        CondensedWriter(got, n, diagonal).write(b, full[b.r0 : b.r1, b.c0 : b.c1].clone())
    monkeypatch.setattr(writers, "compiled_condensed_scatter", lambda: None)
    for b in blocks:
        CondensedWriter(want, n, diagonal).write(b, full[b.r0 : b.r1, b.c0 : b.c1].clone())
    assert not want.isnan().any()  # the blocks cover the upper triangle
    assert _same_bits(got, want)
