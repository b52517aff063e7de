"""hmmlearn's classes, ours (``semiring_ops.hmm`` / ``semiring_ops.vhmm``) beside hmmlearn's, one table, one process.

Per EM iteration, on the shapes hmmlearn's users run and on a mid shape (issue 28's targets):
    user shapes   one sequence: CategoricalHMM 2 states, T = 30,000, 6 symbols (hmmlearn's casino example);
                  GaussianHMM 4 states full, 3 states diag, T = 1,000, D = 2; GMMHMM, PoissonHMM, MultinomialHMM
                  and the two variational models on one sequence of 1,000 (categorical: 30,000) steps
    mid shape     200 sequences x 100 steps, 10 states: categorical (20 symbols), Gaussian diag and full (D = 5),
                  GMMHMM (4 mixtures, D = 5, diag), Poisson and multinomial (20 features), the variational models
Data: a sticky random Markov chain of states (numpy, seeded), observations drawn per state (symbols, Gaussians
around state means, Poisson counts, multinomial counts); never constant.

Timing: each system fits the same data twice from the parameters its own 0-iteration fit initialised (same
random_state; init_params="" for the timed fits, so no k-means), with n_iter = K1 and K2 (tol = -inf, so every
iteration runs); per iteration = (t(K2) - t(K1)) / (K2 - K1), which cancels setup, median of --reps such pairs,
ours and hmmlearn's taking turns in each repetition. "fit ms" is one whole fit with K2 iterations, initialisation
(k-means) included. "x" = hmmlearn / ours (> 1: ours faster). Both run single-threaded (torch.set_num_threads(1) unless
--threads; hmmlearn is single-threaded). The check column is |log-likelihood ours - hmmlearn| after K2 iterations
relative to |hmmlearn's|.

--device cuda adds, for the non-variational classes, our torch HMM of the same parameters on the GPU (estimator
._model().to("cuda"), fit(X, lengths, n_iter=...)) at --gpu-sequences sequences (default 4,000) of the mid
shape, against hmmlearn's class on the CPU.

Usage:
    python benchmarks/hmm_dropin.py                         # both shape sets, 2-core CPU
    python benchmarks/hmm_dropin.py --only user --reps 3
    python benchmarks/hmm_dropin.py --device cuda --only gpu
"""

from __future__ import annotations

import argparse
import copy
import datetime
import inspect
import logging
import statistics
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch


@dataclass
class Case:
    group: str  # user | mid
    cls: str  # class name, in hmm or vhmm
    module: str  # hmm | vhmm
    kwargs: dict
    kind: str  # categorical | gaussian | poisson | multinomial
    sequences: int
    steps: int
    features: int  # symbols for categorical


def cases() -> list[Case]:
    out = [
        Case("user", "CategoricalHMM", "hmm", {"n_components": 2}, "categorical", 1, 30000, 6),
        Case("user", "GaussianHMM", "hmm", {"n_components": 4, "covariance_type": "full"}, "gaussian", 1, 1000, 2),
        Case("user", "GaussianHMM", "hmm", {"n_components": 3, "covariance_type": "diag"}, "gaussian", 1, 1000, 2),
        Case(
            "user", "GMMHMM", "hmm", {"n_components": 3, "n_mix": 2, "covariance_type": "diag"}, "gaussian", 1, 1000, 2
        ),
        Case("user", "PoissonHMM", "hmm", {"n_components": 4}, "poisson", 1, 1000, 1),
        Case("user", "MultinomialHMM", "hmm", {"n_components": 2, "n_trials": 5}, "multinomial", 1, 1000, 3),
        Case("user", "VariationalCategoricalHMM", "vhmm", {"n_components": 2}, "categorical", 1, 30000, 6),
        Case(
            "user",
            "VariationalGaussianHMM",
            "vhmm",
            {"n_components": 3, "covariance_type": "full"},
            "gaussian",
            1,
            1000,
            2,
        ),
    ]
    mid = [
        ("CategoricalHMM", "hmm", {}, "categorical", 20),
        ("GaussianHMM", "hmm", {"covariance_type": "diag"}, "gaussian", 5),
        ("GaussianHMM", "hmm", {"covariance_type": "full"}, "gaussian", 5),
        ("GMMHMM", "hmm", {"n_mix": 4, "covariance_type": "diag"}, "gaussian", 5),
        ("PoissonHMM", "hmm", {}, "poisson", 20),
        ("MultinomialHMM", "hmm", {"n_trials": 10}, "multinomial", 20),
        ("VariationalCategoricalHMM", "vhmm", {}, "categorical", 20),
        ("VariationalGaussianHMM", "vhmm", {"covariance_type": "diag"}, "gaussian", 5),
    ]
    out += [Case("mid", c, m, {"n_components": 10, **kw}, k, 200, 100, f) for c, m, kw, k, f in mid]
    return out


def make_data(case: Case, sequences: int, rng: np.random.Generator) -> tuple[np.ndarray, list[int]]:
    """Observations (sequences * steps, features or 1) from a sticky random chain over the case's states."""
    C, T, D = case.kwargs["n_components"], case.steps, case.features
    trans = rng.dirichlet(np.ones(C), size=C) * 0.3 + np.eye(C) * 0.7
    states = np.empty((sequences, T), dtype=np.int64)
    states[:, 0] = rng.integers(0, C, sequences)
    for t in range(1, T):
        u = rng.random(sequences)[:, None]
        states[:, t] = (trans[states[:, t - 1]].cumsum(1) < u).sum(1).clip(max=C - 1)
    s = states.reshape(-1)
    if case.kind == "categorical":
        table = rng.dirichlet(np.ones(D) * 0.5, size=C)
        X = ((table[s].cumsum(1) < rng.random(len(s))[:, None]).sum(1).clip(max=D - 1))[:, None]
    elif case.kind == "gaussian":
        X = rng.normal(size=(C, D))[s] * 3 + rng.normal(size=(len(s), D))
    elif case.kind == "poisson":
        X = rng.poisson(rng.uniform(0.5, 8, size=(C, D))[s])
    else:
        n = case.kwargs["n_trials"]
        X = np.stack([rng.multinomial(n, p) for p in rng.dirichlet(np.ones(D), size=C)[s]])
    return X, [T] * sequences


def per_iteration(fits: list[Callable[[int], object]], k1: int, k2: int, reps: int) -> list[tuple[float, float]]:
    """For each system, (median ms per iteration by the difference of two fits, median ms of the K2 fit). The
    systems take turns within each repetition, so a slow spell of the machine falls on all of them alike."""
    for fit in fits:
        fit(k1)  # warm-up: imports, kernel builds
    diffs: list[list[float]] = [[] for _ in fits]
    totals: list[list[float]] = [[] for _ in fits]
    for _ in range(reps):
        for i, fit in enumerate(fits):
            t0 = time.perf_counter()
            fit(k1)
            t1 = time.perf_counter()
            fit(k2)
            t2 = time.perf_counter()
            diffs[i].append(((t2 - t1) - (t1 - t0)) / (k2 - k1) * 1e3)
            totals[i].append((t2 - t1) * 1e3)
    return [(statistics.median(d), statistics.median(t)) for d, t in zip(diffs, totals, strict=True)]


def fitter(module, case: Case, X, lengths, seed: int) -> Callable[[int], object]:
    cls = getattr(module, case.cls)
    # categorical: every symbol of the table, even one the data happens to miss
    extra = {"n_features": case.features} if "n_features" in inspect.signature(cls).parameters else {}

    def fit(n_iter: int):
        model = cls(**case.kwargs, **extra, n_iter=n_iter, tol=-np.inf, random_state=seed)
        model.fit(X, lengths)
        return model

    return fit


def warm_fitter(fit: Callable[[int], object], X, lengths) -> Callable[[int], object]:
    """fit(n_iter) from the parameters a 0-iteration fit initialised (init_params="": no k-means, no random
    draws): the difference of two such fits is EM iterations only, where the k-means of a cold fit (~1 s on the
    mid shape, with its own run-to-run spread) would swamp a few iterations of ~20 ms."""
    initialised = fit(0)

    def fit_warm(n_iter: int):
        model = copy.deepcopy(initialised)
        model.n_iter, model.init_params = n_iter, ""
        model.monitor_.n_iter = n_iter
        model.fit(X, lengths)
        return model

    return fit_warm


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", choices=["user", "mid", "gpu", "all"], default="all")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--k1", type=int, default=2)
    parser.add_argument("--k2", type=int, default=7)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--gpu-sequences", type=int, default=4000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--classes", nargs="*", default=None, help="only these classes (e.g. GaussianHMM)")
    args = parser.parse_args()
    logging.disable(logging.WARNING)
    warnings.simplefilter("ignore")
    torch.set_num_threads(args.threads)

    import hmmlearn
    from hmmlearn import hmm as their_hmm
    from hmmlearn import vhmm as their_vhmm

    import semiring_ops
    from semiring_ops import hmm as our_hmm
    from semiring_ops import vhmm as our_vhmm

    ours_mod = {"hmm": our_hmm, "vhmm": our_vhmm}
    theirs_mod = {"hmm": their_hmm, "vhmm": their_vhmm}
    print(f"semiring_ops {semiring_ops.__version__} | hmmlearn {hmmlearn.__version__} | torch {torch.__version__}")
    print(
        f"hmm drop-in, {args.device}, torch threads {args.threads}, K = {args.k1} / {args.k2}, median of "
        f"{args.reps}, {datetime.date.today()}"
    )
    rows = []
    for case in cases():
        if args.only not in ("all", case.group) and not (args.only == "gpu" and case.group == "mid"):
            continue
        if args.only == "gpu" and case.module == "vhmm":
            continue
        if args.classes is not None and case.cls not in args.classes:
            continue
        rng = np.random.default_rng(args.seed)
        sequences = args.gpu_sequences if args.only == "gpu" else case.sequences
        X, lengths = make_data(case, sequences, rng)
        label = f"{case.cls}({', '.join(f'{k}={v}' for k, v in case.kwargs.items() if k != 'n_components')})"
        theirs = fitter(theirs_mod[case.module], case, X, lengths, args.seed)
        if args.only == "gpu":
            model = fitter(ours_mod[case.module], case, X, lengths, args.seed)(1)
            gpu = model._model().to("cuda")
            Xc = torch.as_tensor(X, device="cuda")

            def ours_fit(n_iter: int, gpu=gpu, Xc=Xc, lengths=lengths) -> None:
                gpu.fit(Xc, lengths, n_iter=n_iter, tol=-np.inf)
                torch.cuda.synchronize()

            (o_iter, o_fit), (t_iter, t_fit) = per_iteration([ours_fit, theirs], args.k1, args.k2, args.reps)
            check = "-"
        else:
            ours = fitter(ours_mod[case.module], case, X, lengths, args.seed)
            warm = [warm_fitter(f, X, lengths) for f in (ours, theirs)]
            (o_iter, _), (t_iter, _) = per_iteration(warm, args.k1, args.k2, args.reps)
            (_, o_fit), (_, t_fit) = per_iteration([ours, theirs], 0, args.k2, 1)  # whole fits, k-means included
            a, b = ours(args.k2), theirs(args.k2)
            la, lb = a.score(X, lengths), b.score(X, lengths)
            check = f"{abs(la - lb) / max(abs(lb), 1e-300):.1e}"
        shape = f"{sequences} x {case.steps}, C={case.kwargs['n_components']}, D={case.features}"
        rows.append((case.group if args.only != "gpu" else "gpu", label, shape, o_iter, t_iter, o_fit, t_fit, check))
        r = rows[-1]
        print(
            f"{r[0]:5s} {r[1]:55s} {r[2]:28s} ours {r[3]:8.2f} ms/iter | hmmlearn {r[4]:8.2f} | "
            f"x {r[4] / r[3]:5.2f} | {r[7]}",
            flush=True,
        )
    print()
    print(
        "| shapes | class | data | ours ms/iter | hmmlearn ms/iter | x | ours fit ms | hmmlearn fit ms | ll rel. diff |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for g, label, shape, o_iter, t_iter, o_fit, t_fit, check in rows:
        print(
            f"| {g} | {label} | {shape} | {o_iter:.2f} | {t_iter:.2f} | {t_iter / o_iter:.2f} | {o_fit:.1f} | "
            f"{t_fit:.1f} | {check} |"
        )


if __name__ == "__main__":
    main()
