"""The block engine (semiring_ops.blocks): dense / pdist / matmul against their one-shot references, with
budgets that force many blocks and several CPU workers (the orchestration CI can run), out=, errors, a
failing block, an out-of-memory split, Ctrl-C, progress."""

from __future__ import annotations

import itertools
import os
import signal
import threading
import time

import numpy as np
import pytest
import torch
from conftest import CUDA
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.cluster.hierarchy import linkage
from scipy.spatial.distance import pdist as scipy_pdist
from scipy.spatial.distance import squareform

from semiring_ops import blocks, semiring_matmul
from semiring_ops.blocks import engine, host_memory, writers
from semiring_ops.blocks.api import dense, matmul, pdist
from semiring_ops.blocks.engine import BlockError, run_blocks
from semiring_ops.blocks.policies import MatmulPolicy
from semiring_ops.blocks.scheduler import Block, plan_blocks
from semiring_ops.blocks.writers import DenseWriter
from semiring_ops.lazy import Vi, Vj

CPU3 = ["cpu", "cpu", "cpu"]  # three CPU workers sharing one queue


def _gauss(x, y):
    return (-((Vi(x) - Vj(y)) ** 2).sum(-1) / 2).exp()


@settings(deadline=None, max_examples=12)
@given(m=st.integers(1, 70), n=st.integers(1, 70), budget=st.integers(400, 40_000), seed=st.integers(0, 99))
def test_dense_equals_the_one_shot_values_with_many_blocks(m, n, budget, seed):
    g = torch.Generator().manual_seed(seed)
    x, y = torch.randn(m, 3, generator=g, dtype=torch.float64), torch.randn(n, 3, generator=g, dtype=torch.float64)
    out = torch.full((m, n), float("nan"), dtype=torch.float64)  # poisoned: every cell must be written
    got = dense(_gauss(x, y), out, devices=CPU3, max_device_bytes=budget, progress=False)
    assert got is out
    torch.testing.assert_close(out, _gauss(x, y).dense()[..., 0], rtol=0, atol=0)


def test_dense_of_a_vector_formula_keeps_its_value_dim():
    x, y = torch.randn(41, 2), torch.randn(29, 2)
    K = Vi(x) * Vj(y)  # (M, N, 2)
    got = dense(K, devices=CPU3, max_device_bytes=2_000, progress=False)
    assert got.shape == (41, 29, 2)
    torch.testing.assert_close(got, K.dense())


@pytest.mark.parametrize("scatter", ["compiled", "index_copy"])  # the CPU extension's, or the fallback's
@pytest.mark.parametrize("diagonal", [False, True])
@settings(deadline=None, max_examples=8)
@given(n=st.integers(1, 90), budget=st.integers(300, 30_000), seed=st.integers(0, 99))
def test_pdist_is_scipy_pdist_in_its_layout(scatter, diagonal, n, budget, seed):
    if scatter == "compiled" and writers.compiled_condensed_scatter() is None:
        pytest.skip("the CPU kernels are not compiled here")
    x = torch.randn(n, 4, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    K = ((Vi(x) - Vj(x)) ** 2).sum(-1).sqrt()
    out = torch.full((n * (n + 1) // 2 if diagonal else n * (n - 1) // 2,), float("nan"), dtype=torch.float64)
    with pytest.MonkeyPatch.context() as mp:
        if scatter == "index_copy":
            mp.setattr(writers, "compiled_condensed_scatter", lambda: None)
        got = pdist(K, diagonal=diagonal, out=out, devices=CPU3, max_device_bytes=budget, progress=False).numpy()
    if diagonal:
        full = K.dense()[..., 0].numpy()
        np.testing.assert_allclose(got, full[np.triu_indices(n)], rtol=0, atol=1e-12)
    else:
        np.testing.assert_allclose(got, scipy_pdist(x.numpy()), rtol=1e-12, atol=1e-12)


def test_condensed_scatter_checks_its_block():
    scatter = writers.compiled_condensed_scatter()
    if scatter is None:
        pytest.skip("the CPU kernels are not compiled here")
    out, values = torch.zeros(10), torch.ones(2, 3)  # n = 5: 10 pairs
    with pytest.raises(RuntimeError, match="outside n = 5"):
        scatter(out, values, 5, 4, 0, False)  # rows [4, 6)
    with pytest.raises(RuntimeError, match="out holds 10 values; n = 6 needs 15"):
        scatter(out, values, 6, 0, 0, False)
    with pytest.raises(RuntimeError, match="out is Float and values Double"):
        scatter(out, values.double(), 5, 0, 0, False)
    scatter(out, values, 5, 0, 2, False)  # rows 0, 1 x cols 2..4: pairs (0, 2..4), (1, 2..4)
    assert out.tolist() == [0, 1, 1, 1, 1, 1, 1, 0, 0, 0]


def test_host_memory_empty_is_a_usable_output():
    big = host_memory.empty((3000, 7000))  # 84 MB: an anonymous mapping with huge pages asked for
    small = host_memory.empty((30, 7), torch.float64)
    assert big.shape == (3000, 7000) and big.dtype == torch.float32 and big.is_contiguous()
    assert small.shape == (30, 7) and small.dtype == torch.float64
    big.fill_(2.5)
    x = torch.randn(3000, 2)
    got = dense(_gauss(x, x), big[:, :3000], devices=CPU3, progress=False)
    torch.testing.assert_close(got, _gauss(x, x).dense()[..., 0])
    assert big[:, 3000:].eq(2.5).all()  # nothing written outside the requested region


def test_pdist_feeds_squareform_and_hierarchical_clustering():
    x = torch.randn(60, 3, dtype=torch.float64)
    d = pdist(((Vi(x) - Vj(x)) ** 2).sum(-1).sqrt(), max_device_bytes=5_000, progress=False).numpy()
    np.testing.assert_allclose(squareform(d), squareform(scipy_pdist(x.numpy())), atol=1e-12)
    np.testing.assert_allclose(linkage(d, "average"), linkage(scipy_pdist(x.numpy()), "average"), atol=1e-9)


def test_pdist_refuses_a_formula_of_two_point_sets():
    x, y = torch.randn(5, 2), torch.randn(5, 2)
    with pytest.raises(ValueError, match="Vi\\(x\\) and Vj\\(x\\) of the same x"):
        pdist(((Vi(x) - Vj(y)) ** 2).sum(-1), progress=False)


@pytest.mark.parametrize("semiring", ["log", "max", "min", "std"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_matmul_equals_semiring_matmul(semiring, dtype):
    g = torch.Generator().manual_seed(1)
    a, b = torch.randn(67, 19, generator=g, dtype=dtype), torch.randn(19, 93, generator=g, dtype=dtype)
    out = torch.full((67, 93), float("nan"), dtype=dtype)
    matmul(a, b, semiring, out, devices=CPU3, max_device_bytes=8_000, progress=False)
    torch.testing.assert_close(out, semiring_matmul(a, b, semiring))


def test_empty_outputs():
    assert dense(_gauss(torch.randn(0, 3), torch.randn(4, 3)), progress=False).shape == (0, 4)
    assert pdist(((Vi(torch.randn(1, 2)) - Vj(torch.randn(1, 2))) ** 2).sum(-1), progress=False).shape == (0,)
    assert matmul(torch.randn(3, 0), torch.randn(0, 0), "max", progress=False).shape == (3, 0)


def test_out_is_checked_and_named():
    a, b = torch.randn(4, 3), torch.randn(3, 5)
    with pytest.raises(ValueError, match=r"out has shape \(5, 4\)"):
        matmul(a, b, "log", torch.empty(5, 4), progress=False)
    with pytest.raises(ValueError, match=r"out has shape .* torch.float64"):
        matmul(a, b, "log", torch.empty(4, 5, dtype=torch.float64), progress=False)
    with pytest.raises(ValueError, match="b must be a 2-D tensor"):
        matmul(a, torch.randn(2, 3, 5), "log", progress=False)
    with pytest.raises(ValueError, match="inner sizes differ"):
        matmul(a, torch.randn(4, 5), "log", progress=False)
    with pytest.raises(TypeError, match=r"K must be a semiring_ops\.lazy LazyTensor"):
        dense(torch.randn(3, 3), progress=False)


def test_devices_are_checked():
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="no CUDA GPU"):
            engine.resolve_devices(["cuda:0"])
        with pytest.raises(ValueError, match="devices='all'"):
            engine.resolve_devices("all")
    with pytest.raises(ValueError, match="empty list"):
        engine.resolve_devices([])
    with pytest.raises(ValueError, match="neither a CUDA device nor the CPU"):
        engine.resolve_devices(["meta"])


class _Failing(MatmulPolicy):
    """A product whose block starting at row `bad_row` raises; every block takes a little time."""

    def __init__(self, a, b, bad_row):
        super().__init__(a, b, "max")
        self.bad_row, self.calls = bad_row, 0

    def compute(self, state, block, device):
        self.calls += 1
        time.sleep(0.01)
        if block.r0 == self.bad_row:
            raise ArithmeticError("boom")
        return super().compute(state, block, device)


def test_a_failing_block_stops_the_pool_and_names_the_block():
    a, b = torch.randn(200, 4), torch.randn(4, 200)
    policy = _Failing(a, b, bad_row=0)
    grid = plan_blocks(200, 200, free_bytes=None, max_device_bytes=4 * 4 * 20 * 20, sm_count=1, rows_per_sm=1)
    assert len(grid.blocks) == 100
    out = torch.zeros(200, 200)
    with pytest.raises(BlockError, match=r"block rows \[0, 20\) x columns \[\d+, \d+\) on cpu: ArithmeticError: boom"):
        run_blocks(policy, DenseWriter(out), grid, [torch.device("cpu")] * 2)
    assert policy.calls < 100  # the others stopped at their next block
    assert not any(t.name.startswith("semiring_ops.blocks") for t in threading.enumerate())


def test_a_block_that_runs_out_of_memory_is_split_and_retried():
    class Tight(MatmulPolicy):
        def compute(self, state, block, device):
            if block.rows * block.cols > 100:
                raise torch.cuda.OutOfMemoryError("CUDA out of memory (simulated)")
            return super().compute(state, block, torch.device("cpu"))

    a, b = torch.randn(37, 5), torch.randn(5, 29)
    policy = Tight(a, b, "log")
    whole = Block(0, 0, 0, 0, 37, 0, 29, 37 * 29, False)
    pieces = engine._compute_fitting(policy, None, whole, torch.device("cuda"))  # the device is only a label
    assert len(pieces) > 1 and all(p.rows * p.cols <= 100 for p, _ in pieces)
    out = torch.full((37, 29), float("nan"))
    for piece, values in pieces:
        DenseWriter(out).write(piece, values)
    torch.testing.assert_close(out, semiring_matmul(a, b, "log"))


@pytest.mark.skipif(os.name != "posix", reason="SIGINT to this process")
def test_ctrl_c_stops_every_worker_and_goes_on():
    """A real SIGINT to this process in the middle of a run: KeyboardInterrupt comes out of run_blocks once every
    worker has finished the block in hand, and no thread is left. Independent of timing: the signal is sent from
    the fifth block, and the blocks computed after it wait until the main thread has received it; and of how the
    test runner was started: a job run in the background of a non-interactive shell ignores SIGINT (Python then
    installs no KeyboardInterrupt for it), so the test installs Python's own behaviour for its duration."""
    delivered = threading.Event()
    computed: list[int] = []
    lock = threading.Lock()

    def keyboard_interrupt(signum, frame):  # signal.default_int_handler, noting the delivery
        delivered.set()
        raise KeyboardInterrupt

    class Interrupting(MatmulPolicy):
        def compute(self, state, block, device):
            with lock:
                computed.append(block.index)
                fifth = len(computed) == 5
            if fifth:
                os.kill(os.getpid(), signal.SIGINT)
            if len(computed) >= 5 and not delivered.wait(60):
                raise AssertionError("SIGINT never reached the main thread")
            return super().compute(state, block, device)

    policy = Interrupting(torch.randn(300, 3), torch.randn(3, 300), "max")
    grid = plan_blocks(300, 300, max_device_bytes=4 * 4 * 10 * 10, sm_count=1, rows_per_sm=1)
    workers = 2
    previous = signal.signal(signal.SIGINT, keyboard_interrupt)
    try:
        with pytest.raises(KeyboardInterrupt):
            run_blocks(
                policy, DenseWriter(torch.zeros(300, 300)), grid, [torch.device("cpu")] * workers, progress=False
            )
    finally:
        signal.signal(signal.SIGINT, previous)
    assert delivered.is_set()
    assert 5 <= len(computed) <= 5 + workers < len(grid.blocks), "each worker stops after the block in hand"
    assert not any(t.name.startswith("semiring_ops.blocks") for t in threading.enumerate())


def test_an_interrupt_while_the_workers_start_leaves_none_running(monkeypatch):
    """KeyboardInterrupt out of the second worker's start (where a Ctrl-C could land before the engine held it):
    run_blocks stops and waits for the one worker that did start, and raises, rather than waiting for the one that
    never ran."""
    starts = []
    real_start = threading.Thread.start

    class Thread(threading.Thread):
        def start(self):
            starts.append(self.name)
            if len(starts) == 2:
                raise KeyboardInterrupt
            real_start(self)

    monkeypatch.setattr(engine.threading, "Thread", Thread)
    policy = MatmulPolicy(torch.randn(300, 3), torch.randn(3, 300), "max")
    grid = plan_blocks(300, 300, max_device_bytes=4 * 4 * 10 * 10, sm_count=1, rows_per_sm=1)
    outcome: list[BaseException | None] = []

    def run() -> None:
        try:
            run_blocks(policy, DenseWriter(torch.zeros(300, 300)), grid, [torch.device("cpu")] * 3, progress=False)
            outcome.append(None)
        except BaseException as exc:
            outcome.append(exc)

    caller = threading.Thread(target=run)  # (the real Thread: the patch is the engine's)
    real_start(caller)
    caller.join(60)
    assert not caller.is_alive(), "run_blocks hung waiting for a worker that never started"
    assert len(outcome) == 1 and isinstance(outcome[0], KeyboardInterrupt)
    assert len(starts) == 2
    assert not any(t.name.startswith("semiring_ops.blocks") for t in threading.enumerate())


def test_progress_line_without_tqdm(capsys, monkeypatch):
    monkeypatch.setitem(__import__("sys").modules, "tqdm", None)  # as if tqdm were not installed
    dense(_gauss(torch.randn(30, 2), torch.randn(30, 2)), devices=CPU3, max_device_bytes=2_000, progress=True)
    err = capsys.readouterr().err
    assert "semiring_ops.blocks:" in err and "blocks," in err and "GB/s" in err
    dense(_gauss(torch.randn(30, 2), torch.randn(30, 2)), devices=CPU3, max_device_bytes=2_000, progress=False)
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("chunk_bytes", [engine.STAGING_CHUNK_BYTES, 4096, 1000])  # whole blocks, many chunks
@pytest.mark.parametrize("device", [CUDA])
def test_cuda_pipeline_matches_the_cpu(device, chunk_bytes, monkeypatch):
    monkeypatch.setattr(engine, "STAGING_CHUNK_BYTES", chunk_bytes)
    g = torch.Generator().manual_seed(5)
    x, y = torch.randn(1001, 3, generator=g), torch.randn(777, 3, generator=g)
    out = torch.full((1001, 777), float("nan"))
    dense(_gauss(x, y), out, devices=[device], max_device_bytes=1 << 20, progress=False)
    torch.testing.assert_close(out, _gauss(x, y).dense()[..., 0])
    a, b = torch.randn(513, 64, generator=g), torch.randn(64, 1025, generator=g)
    torch.testing.assert_close(
        matmul(a, b, "max", devices=[device], max_device_bytes=1 << 20, progress=False),
        semiring_matmul(a, b, "max"),
    )
    xs = torch.randn(900, 3, generator=g, dtype=torch.float64)
    got = pdist(((Vi(xs) - Vj(xs)) ** 2).sum(-1).sqrt(), devices=[device], max_device_bytes=1 << 20, progress=False)
    np.testing.assert_allclose(got.numpy(), scipy_pdist(xs.numpy()), atol=1e-10)


@pytest.mark.cuda
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA GPUs")
def test_two_gpus_share_the_blocks_and_match_the_cpu():
    g = torch.Generator().manual_seed(6)
    x = torch.randn(1500, 3, generator=g, dtype=torch.float64)
    devs = ["cuda:0", "cuda:1"]
    out = dense(_gauss(x, x), devices=devs, max_device_bytes=1 << 20, progress=False)
    assert blocks.last_run().devices == ("cuda:0", "cuda:1") and blocks.last_run().blocks > 8
    torch.testing.assert_close(out, _gauss(x, x).dense()[..., 0])
    got = pdist(((Vi(x) - Vj(x)) ** 2).sum(-1).sqrt(), devices=devs, max_device_bytes=1 << 20, progress=False)
    np.testing.assert_allclose(got.numpy(), scipy_pdist(x.numpy()), atol=1e-10)
    a, b = torch.randn(700, 64, generator=g).cuda(1), torch.randn(64, 900, generator=g)  # a on the second GPU
    torch.testing.assert_close(
        matmul(a, b, "max", devices=devs, max_device_bytes=1 << 20, progress=False), semiring_matmul(a.cpu(), b, "max")
    )


@pytest.mark.parametrize("chunk_bytes", [1, 100, 4 * 7 * 3, 10**9])
def test_row_chunks_cover_a_piece_in_order(chunk_bytes):
    piece = Block(0, 1, 2, 10, 17, 5, 12, 49, False)
    values = torch.arange(7 * 7 * 3, dtype=torch.float32).view(7, 7, 3)  # rows of 7 x 3 values: 84 bytes
    parts = engine._row_chunks(piece, values, chunk_bytes)
    assert parts[0][0].r0 == 10 and parts[-1][0].r1 == 17
    assert all(a[0].r1 == b[0].r0 for a, b in itertools.pairwise(parts))
    assert all(p.c0 == 5 and p.c1 == 12 and v.shape[0] == p.rows for p, v in parts)
    assert all(v.numel() * 4 <= max(chunk_bytes, 84) for _, v in parts)
    torch.testing.assert_close(torch.cat([v for _, v in parts]), values)


def test_lazy_dense_with_out_routes_through_the_blocks():
    x, y = torch.randn(57, 3, dtype=torch.float64), torch.randn(43, 3, dtype=torch.float64)
    K = _gauss(x, y)
    out = torch.full((57, 43, 1), float("nan"), dtype=torch.float64)
    assert K.dense(out, max_device_bytes=3_000) is out  # (M, N, D), as dense() returns
    torch.testing.assert_close(out, K.dense())
    flat = torch.full((57, 43), float("nan"), dtype=torch.float64)
    assert K.dense(flat, progress=False) is flat
    torch.testing.assert_close(flat, K.dense()[..., 0])
    torch.testing.assert_close(K.dense(max_device_bytes=3_000, progress=False), K.dense())  # a new host output


def test_semiring_matmul_out_fills_a_host_output_block_by_block(monkeypatch):
    from semiring_ops.blocks import api

    calls = []
    real = api.matmul
    monkeypatch.setattr(api, "matmul", lambda *a, **k: calls.append(1) or real(*a, **k))
    a, b = torch.randn(45, 7), torch.randn(7, 38)
    out = torch.full((45, 38), float("nan"))
    assert semiring_matmul(a, b, "min", out=out) is out
    assert calls == [1]
    torch.testing.assert_close(out, semiring_matmul(a, b, "min"))
    batched = torch.empty(2, 45, 38)  # not 2-D: a copy of the result
    semiring_matmul(a.expand(2, 45, 7), b, "log", out=batched)
    torch.testing.assert_close(batched, semiring_matmul(a.expand(2, 45, 7), b, "log"))
    with pytest.raises(RuntimeError, match="out= does not support automatic differentiation"):
        semiring_matmul(a.requires_grad_(), b, "log", out=out)
    with pytest.raises(ValueError, match="return_argmax"):
        semiring_matmul(a.detach(), b, "max", out=out, return_argmax=True)


def test_pdist_takes_two_views_of_the_same_points_and_refuses_a_strided_out():
    x = torch.randn(80, 3, dtype=torch.float64)
    got = pdist(((Vi(x[:50]) - Vj(x[:50])) ** 2).sum(-1).sqrt(), max_device_bytes=4_000, progress=False)
    np.testing.assert_allclose(got.numpy(), scipy_pdist(x[:50].numpy()), atol=1e-12)
    with pytest.raises(ValueError, match="out must be contiguous"):
        pdist(((Vi(x) - Vj(x)) ** 2).sum(-1), out=torch.empty(2 * 3160, dtype=torch.float64)[::2], progress=False)


def test_last_run_says_where_the_time_went():
    x = torch.randn(50, 3)
    out = dense(_gauss(x, x), devices=CPU3, max_device_bytes=2_000, progress=False)
    stats = blocks.last_run()
    assert stats.bytes == out.numel() * 4 and stats.blocks > 3 and stats.devices == ("cpu",) * 3
    assert stats.write_seconds > 0 and stats.seconds > 0 and stats.wait_seconds == 0  # no GPU: no copy to wait on
