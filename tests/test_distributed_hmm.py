"""HMM.fit(group=...) over data sharded across gloo CPU ranks (tests/dist_util.py): the same model on every
rank, equal to a one-process fit on the union of the shards; clear errors (never a hang) on bad input."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.distributed as dist

from semiring_ops.structures import HMM
from tests.dist_util import run_ranks

N_ITER, TOL = 8, 1e-6


def _model(kind: str, n_symbols: int = 5, seed: int = 0) -> HMM:
    g = torch.Generator().manual_seed(seed)
    if kind == "categorical":
        return HMM(3, "categorical", n_symbols=n_symbols, generator=g).double()
    return HMM(3, "gaussian", n_features=2, covariance_type=kind, generator=g).double()


def _data(kind: str, n_seq: int = 20, seed: int = 1) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    lengths = rng.integers(10, 31, n_seq)
    n = int(lengths.sum())
    if kind == "categorical":
        return rng.integers(0, 5, n), lengths
    return rng.normal(size=(n, 2)) + 2.0 * rng.integers(0, 3, (n, 1)), lengths


def _shards(lengths: np.ndarray, world: int) -> list[list[int]]:
    """Uneven contiguous shards of the sequences; the last rank gets none."""
    cuts = np.linspace(0, len(lengths), world, dtype=int)  # world - 1 non-empty shards
    return [list(range(cuts[r], cuts[r + 1])) for r in range(world - 1)] + [[]]


def _take(X: np.ndarray, lengths: np.ndarray, seqs: list[int]) -> tuple[np.ndarray, np.ndarray]:
    starts = np.concatenate([[0], np.cumsum(lengths)])
    parts = [X[starts[i] : starts[i + 1]] for i in seqs]
    X_r = np.concatenate(parts) if parts else X[:0]
    return X_r, lengths[seqs]


def _result(model: HMM) -> dict:
    return {
        # numpy, not tensors: a tensor sent back from a spawned rank is shared through a file descriptor
        # that dies with the process
        "state": {k: v.detach().numpy().copy() for k, v in model.state_dict().items()},
        "history": list(model.monitor_.history),
        "iter": model.monitor_.iter,
    }


def _fit_rank(rank: int, world: int, kind: str, X: np.ndarray, lengths: np.ndarray, shards: list) -> dict:
    model = _model(kind, seed=0 if rank == 0 else 100 + rank)  # other ranks start elsewhere: rank 0's wins
    X_r, L_r = _take(X, lengths, shards[rank])
    model.fit(X_r, L_r, n_iter=N_ITER, tol=TOL, group=dist.group.WORLD)
    return _result(model)


def _assert_same(a: dict, b: dict, exact: bool = False) -> None:
    assert a["iter"] == b["iter"]
    rtol = 0.0 if exact else 1e-10
    np.testing.assert_allclose(a["history"], b["history"], rtol=rtol, atol=0)
    assert a["state"].keys() == b["state"].keys()
    for k in a["state"]:
        np.testing.assert_allclose(a["state"][k], b["state"][k], rtol=rtol, atol=0 if exact else 1e-12, err_msg=k)


@pytest.mark.parametrize("kind,world", [("categorical", 2), ("categorical", 3), ("diag", 2), ("diag", 3), ("full", 3)])
def test_sharded_fit_equals_one_process_fit(kind: str, world: int) -> None:
    X, lengths = _data(kind)
    results = run_ranks(_fit_rank, world, kind, X, lengths, _shards(lengths, world))
    reference = _model(kind).fit(X, lengths, n_iter=N_ITER, tol=TOL)
    ref = _result(reference)
    assert ref["iter"] >= 3
    for r in results:
        _assert_same(r, results[0], exact=True)  # every rank holds the same model
        _assert_same(r, ref)


def _fit_one_rank(rank: int, world: int, X: np.ndarray, lengths: np.ndarray) -> dict:
    model = _model("diag")
    model.fit(X, lengths, n_iter=N_ITER, tol=TOL, group=dist.group.WORLD)
    return _result(model)


def test_group_of_one_rank_is_a_local_fit() -> None:
    X, lengths = _data("diag")
    (result,) = run_ranks(_fit_one_rank, 1, X, lengths)
    _assert_same(result, _result(_model("diag").fit(X, lengths, n_iter=N_ITER, tol=TOL)), exact=True)


def _fit_bad(rank: int, world: int, case: str) -> None:
    X, lengths = _data("categorical", n_seq=4, seed=rank)
    n_symbols, n_iter = 5, N_ITER
    if case == "n_symbols":
        n_symbols += rank
    elif case == "n_iter":
        n_iter += rank
    elif case == "empty":
        X, lengths = X[:0], lengths[:0]
    elif case == "bad_symbols" and rank == 1:
        X = X + 10
    _model("categorical", n_symbols=n_symbols).fit(X, lengths, n_iter=n_iter, group=dist.group.WORLD)


@pytest.mark.parametrize(
    "case,message",
    [
        ("n_symbols", "the ranks disagree on n_symbols"),
        ("n_iter", "the ranks disagree on n_iter"),
        ("empty", "fit needs at least one sample"),
        ("bad_symbols", "n_symbols=5 allows 0..4"),
    ],
)
def test_bad_input_raises_on_every_rank(case: str, message: str) -> None:
    world = 2
    with pytest.raises(RuntimeError) as info:
        run_ranks(_fit_bad, world, case, timeout=60)
    text = str(info.value)
    assert message in text
    for r in range(world):  # every rank raised (none hung)
        assert f"rank {r}:" in text
