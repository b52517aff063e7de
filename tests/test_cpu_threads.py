"""Every CPU kernel family on several threads gives what it gives on one.

The suite's xdist workers run on one thread each where the workers fill the cores (conftest.py,
_threads_per_worker), so the parallel paths (at::parallel_for in csrc/cpu, OpenMP in the lazy reductions' generated
code) are run here, at sizes that split each kernel's work into more tasks than threads (its grain), on 3 threads: an
odd count, so the last thread's share is not the others'. A race, a shared scratch buffer, a reduction that depends
on the split, or a task range computed wrong shows as a difference from the one-thread run (or a NaN in a poisoned
output).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
import torch

import semiring_ops as so
from semiring_ops.blocks import writers
from semiring_ops.blocks.scheduler import Block
from semiring_ops.blocks.writers import CondensedWriter
from semiring_ops.hmm import GaussianHMM
from semiring_ops.lazy import LazyTensor
from semiring_ops.structures import CKYTree, DependencyTree, SemiMarkov

THREADS = 3


@contextlib.contextmanager
def _threads(n: int) -> Iterator[None]:
    saved = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(saved)


def _on_one_and_many(fn: Callable[[], Any]) -> tuple[Any, Any]:
    with _threads(1):
        one = fn()
    with _threads(THREADS):
        many = fn()
    return one, many


def _same(one: list[torch.Tensor], many: list[torch.Tensor], rtol: float = 0.0, atol: float = 0.0) -> None:
    assert len(one) == len(many)
    for a, b in zip(one, many, strict=True):
        assert not b.isnan().any() if b.is_floating_point() else True
        torch.testing.assert_close(b, a, rtol=rtol, atol=atol, equal_nan=True)


def _block(r0: int, r1: int, c0: int, c1: int) -> Block:
    return Block(0, 0, 0, r0, r1, c0, c1, (r1 - r0) * (c1 - c0), False)


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


@pytest.mark.parametrize("op", ["log", "max", "min", "std"])
def test_bmm_and_its_gradients(op):
    """(8, 131, 257) x (8, 257, 97): thousands of output tiles, each a task of the tile loop."""
    g = _gen(1)
    a0, b0 = torch.randn(8, 131, 257, generator=g, dtype=torch.float64), torch.randn(8, 257, 97, generator=g).double()

    def run() -> list[torch.Tensor]:
        a, b = a0.clone().requires_grad_(), b0.clone().requires_grad_()
        if op == "max":
            out, arg = so.maxbmm(a, b, return_argmax=True)
            extra = [arg]
        else:
            out = {"log": so.logbmm, "min": so.minbmm, "std": so.stdbmm}[op](a, b)
            extra = []
        out.backward(torch.randn(out.shape, generator=_gen(2), dtype=out.dtype))
        return [out.detach(), *extra, a.grad, b.grad]

    _same(*_on_one_and_many(run))


def test_crf_log_likelihood_gradients_and_decoding():
    """256 sequences of up to 40 steps over 9 tags: batches split over threads (grain 2^16 / (T C^2))."""
    g = _gen(3)
    crf = so.LinearChainCRF(9, batch_first=True).double()
    for p in crf.parameters():
        torch.nn.init.normal_(p, generator=g)
    emissions0 = torch.randn(256, 40, 9, generator=g, dtype=torch.float64)
    tags = torch.randint(0, 9, (256, 40), generator=g)
    mask = torch.arange(40)[None, :] < torch.randint(1, 41, (256, 1), generator=g)

    def run() -> list[torch.Tensor]:
        crf.zero_grad()
        emissions = emissions0.clone().requires_grad_()
        llh = crf(emissions, tags, mask, reduction="none")
        llh.sum().backward()
        best = crf.decode(emissions.detach(), mask)
        padded = torch.tensor([path + [-1] * (40 - len(path)) for path in best])
        return [llh.detach(), emissions.grad, padded], [p.grad for p in crf.parameters()]

    (one, one_params), (many, many_params) = _on_one_and_many(run)
    _same(one, many)
    _same(one_params, many_params, rtol=1e-12, atol=1e-12)  # batch sums: per thread, then over threads


@pytest.mark.parametrize(
    ("structure", "shape"),
    [(DependencyTree(True), (16, 23, 23)), (CKYTree(), (16, 19, 19, 3)), (SemiMarkov(), (16, 30, 4, 3, 3))],
    ids=["dependency", "cky", "semi-Markov"],
)
def test_structures_partition_and_marginals(structure, shape):
    """16 trees / segmentations of different lengths, one a task."""
    g = _gen(4)
    pot0 = torch.randn(shape, generator=g, dtype=torch.float64)
    lengths = torch.randint(1, shape[1] + 1, (shape[0],), generator=g)
    lengths[0] = shape[1]

    def run() -> list[torch.Tensor]:
        pot = pot0.clone().requires_grad_()
        total = structure.partition(pot, lengths)
        (grad,) = torch.autograd.grad(total.sum(), pot)
        return [total.detach(), grad]

    _same(*_on_one_and_many(run))


def test_ctc_loss_and_its_gradient():
    g = _gen(5)
    T, N, C, S = 60, 12, 20, 15
    logits0 = torch.randn(T, N, C, generator=g, dtype=torch.float64)
    targets = torch.randint(1, C, (N, S), generator=g)
    input_lengths = torch.randint(S * 2, T + 1, (N,), generator=g)
    target_lengths = torch.randint(1, S + 1, (N,), generator=g)

    def run() -> list[torch.Tensor]:
        logits = logits0.clone().requires_grad_()
        loss = so.ctc_loss(logits.log_softmax(-1), targets, input_lengths, target_lengths, reduction="none")
        loss.sum().backward()
        return [loss.detach(), logits.grad]

    _same(*_on_one_and_many(run))


def test_gaussian_hmm_fit():
    """200 sequences: the scaled E-step splits them over threads (grain 2^15 / (T (C^2 + C))), the emissions their
    frames. The M-step sums the per-sequence statistics in one order, whatever the threads."""
    rng = np.random.default_rng(6)
    X = np.concatenate([rng.normal(loc=rng.integers(-3, 4), size=(50, 2)) for _ in range(200)])
    lengths = [50] * 200

    def run() -> list[torch.Tensor]:
        model = GaussianHMM(n_components=3, covariance_type="full", n_iter=3, random_state=0, tol=0.0)
        model.fit(X, lengths)
        return [torch.as_tensor(v) for v in (model.startprob_, model.transmat_, model.means_, model.covars_)] + [
            torch.as_tensor(model.score(X, lengths))
        ]

    _same(*_on_one_and_many(run), rtol=1e-12, atol=1e-12)


def test_block_engine_host_writers():
    """A streamed copy of > 1 MiB (pieces over threads) and a condensed scatter of rows over threads."""
    copy = writers.compiled_stream_copy()
    if copy is None or writers.compiled_condensed_scatter() is None:
        pytest.fail("the CPU host writers did not compile")
    src = torch.randn(700, 997, generator=_gen(7))
    n = 901
    full = torch.randn(n, n, 2, generator=_gen(8))
    blocks = [_block(0, 600, 0, 700), _block(0, 600, 700, 901), _block(600, 901, 300, 901)]

    def run() -> list[torch.Tensor]:
        dense = torch.full((701, 1001), float("nan"))
        copy(dense[1:, 2:999], src)
        condensed = torch.full((n * (n - 1) // 2, 2), float("nan"))
        for b in blocks:
            CondensedWriter(condensed, n, False).write(b, full[b.r0 : b.r1, b.c0 : b.c1].clone())
        assert dense[0].isnan().all() and dense[:, :2].isnan().all() and dense[:, 999:].isnan().all()
        return [dense[1:, 2:999], condensed]

    _same(*_on_one_and_many(run))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_lazy_reductions(compiled, dtype):
    """Rows of the generated kernels over threads: a sum, a logsumexp, an argKmin and a gradient."""
    g = _gen(9)
    x0, y = torch.randn(3001, 5, generator=g, dtype=dtype), torch.randn(1999, 5, generator=g, dtype=dtype)
    b = torch.randn(1999, 3, generator=g, dtype=dtype)

    def run() -> list[torch.Tensor]:
        x = x0.clone().requires_grad_()
        d = ((LazyTensor(x[:, None, :]) - LazyTensor(y[None, :, :])) ** 2).sum(-1)
        k = (-d).exp() @ b
        lse = (-d).logsumexp(dim=1)
        (grad,) = torch.autograd.grad(k.sum() + lse.sum(), x)
        return [k.detach(), lse.detach(), d.argKmin(7, dim=1), grad]

    _same(*_on_one_and_many(run))
