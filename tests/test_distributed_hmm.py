"""HMM.fit(group=...) over data sharded across gloo CPU ranks (tests/dist_util.py): the same model on every
rank, equal to a one-process fit on the union of the shards; clear errors (never a hang) on bad input."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.distributed as dist

from semiring_ops import HMM
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


def _fit_rank(rank: int, world: int, cases: list, shards: list) -> list[dict]:
    out = []
    for kind, dtype, X, lengths in cases:
        model = _model(kind, seed=0 if rank == 0 else 100 + rank).to(dtype)  # rank 0's start wins
        X_r, L_r = _take(X, lengths, shards[rank])
        model.fit(X_r, L_r, n_iter=N_ITER, tol=TOL, group=dist.group.WORLD)
        out.append(_result(model))
    return out


def _assert_same(a: dict, b: dict, rtol: float = 1e-10, atol: float = 1e-12) -> None:
    assert a["iter"] == b["iter"]
    np.testing.assert_allclose(a["history"], b["history"], rtol=rtol, atol=0)
    assert a["state"].keys() == b["state"].keys()
    for k in a["state"]:
        np.testing.assert_allclose(a["state"][k], b["state"][k], rtol=rtol, atol=atol, err_msg=k)


@pytest.mark.parametrize(
    "world,kinds",
    [
        (2, [("categorical", torch.float64), ("diag", torch.float64), ("categorical", torch.float32)]),
        (3, [("categorical", torch.float64), ("diag", torch.float64), ("full", torch.float64)]),
    ],
)
def test_sharded_fit_equals_one_process_fit(world: int, kinds: list) -> None:
    """Uneven shards, the last rank empty; every rank ends with one model, the one-process fit's."""
    cases = [(kind, dtype, *_data(kind)) for kind, dtype in kinds]
    _, _, _, lengths = cases[0]
    assert all(len(c[3]) == len(lengths) for c in cases)
    results = run_ranks(_fit_rank, world, cases, _shards(lengths, world))
    for i, (kind, dtype, X, L) in enumerate(cases):
        ref = _result(_model(kind).to(dtype).fit(X, L, n_iter=N_ITER, tol=TOL))
        assert ref["iter"] >= 3
        tol = {"rtol": 1e-10, "atol": 1e-12} if dtype == torch.float64 else {"rtol": 1e-5, "atol": 1e-6}
        for r in range(world):
            _assert_same(results[r][i], results[0][i], rtol=0, atol=0)  # every rank holds the same model
            _assert_same(results[r][i], ref, **tol)


def _fit_one_rank(rank: int, world: int, X: np.ndarray, lengths: np.ndarray) -> dict:
    model = _model("diag")
    model.fit(X, lengths, n_iter=N_ITER, tol=TOL, group=dist.group.WORLD)
    return _result(model)


def test_group_of_one_rank_is_a_local_fit() -> None:
    X, lengths = _data("diag")
    (result,) = run_ranks(_fit_one_rank, 1, X, lengths)
    _assert_same(result, _result(_model("diag").fit(X, lengths, n_iter=N_ITER, tol=TOL)), rtol=0, atol=0)


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


def _hmmlearn_model(seed_shift: int = 0):
    from semiring_ops import hmm

    model = hmm.GaussianHMM(3, covariance_type="diag", n_iter=N_ITER, tol=TOL, init_params="", params="stmc")
    rng = np.random.default_rng(7 + seed_shift)
    model.startprob_ = np.full(3, 1 / 3)
    model.transmat_ = rng.dirichlet(np.ones(3), 3)
    model.means_ = rng.normal(size=(3, 2)) * 2
    model.covars_ = np.ones((3, 2))
    return model


def _hmmlearn_fit_rank(rank: int, world: int, X: np.ndarray, lengths: np.ndarray, shards: list) -> dict:
    model = _hmmlearn_model(seed_shift=rank)  # different starts: rank 0's wins
    X_r, L_r = _take(X, lengths, shards[rank])
    model.fit(X_r, L_r, group=dist.group.WORLD)
    return {"means": model.means_, "covars": model.covars_, "transmat": model.transmat_, "iter": model.monitor_.iter}


def test_hmmlearn_interface_takes_the_group() -> None:
    X, lengths = _data("diag", n_seq=16)
    whole = _hmmlearn_model().fit(X, lengths)
    results = run_ranks(_hmmlearn_fit_rank, 2, X, lengths, [list(range(0, 9)), list(range(9, 16))])
    for r in results:
        assert r["iter"] == whole.monitor_.iter
        np.testing.assert_allclose(r["means"], whole.means_, rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(r["covars"], whole.covars_, rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(r["transmat"], whole.transmat_, rtol=1e-10, atol=1e-12)


def _fit_rank_nccl(rank: int, world: int, cases: list, shards: list) -> list[dict]:
    """_fit_rank with the model and its shard on cuda:rank (NCCL); states brought back to the CPU."""
    dev = torch.device("cuda", rank)
    out = []
    for kind, dtype, X, lengths in cases:
        model = _model(kind, seed=0 if rank == 0 else 100 + rank).to(dtype).to(dev)
        X_r, L_r = _take(X, lengths, shards[rank])
        model.fit(torch.as_tensor(X_r).to(dev), L_r, n_iter=N_ITER, tol=TOL, group=dist.group.WORLD)
        out.append(_result(model.cpu()))
    return out


@pytest.mark.cuda
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA GPUs")
def test_sharded_fit_over_nccl_equals_one_process_fit() -> None:
    cases = [("categorical", torch.float64, *_data("categorical")), ("diag", torch.float64, *_data("diag"))]
    shards = [list(range(0, 12)), list(range(12, 20))]
    results = run_ranks(_fit_rank_nccl, 2, cases, shards, timeout=180, backend="nccl")
    for i, (kind, dtype, X, lengths) in enumerate(cases):
        whole = _model(kind).to(dtype)
        whole.fit(X, lengths, n_iter=N_ITER, tol=TOL)
        for r in results:
            _assert_same(r[i], _result(whole), rtol=1e-9, atol=1e-11)
