"""Categorical HMM on the CPU: ours (semiring_ops.HMM) beside hmmlearn and pomegranate, one table.

The performance target (issue): one EM iteration of a categorical HMM, 200 sequences x 50 steps,
50 states, on a 2-core CPU, at least 3x faster than the faster of hmmlearn and pomegranate.

Workload: a random categorical HMM (50 states, 20 symbols by default; start, transition and emission
rows drawn from a flat Dirichlet, seed --seed) generates 200 sequences of 50 steps. EM starts from a
second random HMM, the same parameters for every system, reset before every timed run.
    EM iteration  ours          HMM(C, "categorical", n_symbols=V).fit(X, lengths, n_iter=1, tol=0)
                  hmmlearn      CategoricalHMM(C, n_features=V, n_iter=1, tol=0, init_params="").fit(X, lengths),
                                both of its implementations ("log", its default, and "scaling")
                  pomegranate   DenseHMM([Categorical] * C, edges, starts, ends=1, max_iter=1).fit(X (N, T, 1))
    forward       score(X, lengths) / pomegranate log_probability(X)   (log-likelihood)
    decode        decode(X, lengths) (Viterbi) / pomegranate viterbi(X)
X is hmmlearn's concatenated (n_samples, 1) int64 array with lengths (pomegranate takes (N, T, 1));
input conversion is inside the timed call for every system. pomegranate's ends are set to probability 1
(no end state), so its likelihood is hmmlearn's. Medians of --reps wall-clock runs after 2 warm-up runs,
parameters reset untimed before each. "x" columns: anchor time / ours fp32 time (> 1: ours faster);
on our rows, the faster anchor's time / ours. Checks compare log-likelihoods, Viterbi paths and the
re-estimated transition matrix after one EM iteration with hmmlearn's.

Reproduce:
    python benchmarks/hmm.py                      # torch uses every core; hmmlearn's core is single-threaded
    python benchmarks/hmm.py --threads 2 --json hmm.json
    python benchmarks/hmm.py --states 10 --sequences 50 --length 20 --reps 3   # quick
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import statistics
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

TARGET = 3.0


@dataclass
class Params:
    startprob: np.ndarray  # (C,)
    transmat: np.ndarray  # (C, C) [from, to]
    emissionprob: np.ndarray  # (C, V)


def random_params(rng: np.random.Generator, C: int, V: int) -> Params:
    return Params(rng.dirichlet(np.ones(C)), rng.dirichlet(np.ones(C), size=C), rng.dirichlet(np.ones(V), size=C))


def sample(rng: np.random.Generator, p: Params, N: int, T: int) -> np.ndarray:
    """N sequences of T symbols (N, T) int64, all sequences stepped together."""
    C, V = p.emissionprob.shape
    cum_trans, cum_emis = p.transmat.cumsum(1), p.emissionprob.cumsum(1)
    states = np.empty((N, T), dtype=np.int64)
    states[:, 0] = np.minimum(np.searchsorted(p.startprob.cumsum(), rng.random(N)), C - 1)
    for t in range(1, T):
        u = rng.random(N)[:, None]
        states[:, t] = np.minimum((cum_trans[states[:, t - 1]] < u).sum(1), C - 1)
    u = rng.random((N, T))[..., None]
    return np.minimum((cum_emis[states] < u).sum(-1), V - 1).astype(np.int64)


def median_ms(fn: Callable[[], object], reps: int, setup: Callable[[], object] | None = None, warmup: int = 2):
    """Median wall-clock ms of fn() over reps runs after warm-up; setup() runs untimed before each."""
    times = []
    for i in range(warmup + reps):
        if setup is not None:
            setup()
        t0 = time.perf_counter()
        fn()
        if i >= warmup:
            times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def guarded(fn: Callable[[], float]) -> float | str:
    try:
        return fn()
    except Exception as exc:
        return f"ERR {type(exc).__name__}: {str(exc)[:60]}"


# ---------------------------------------------------------------- systems
# each returns {"em": ms, "score": ms, "decode": ms, "check": {...}} or a string saying why not


def bench_ours(dtype, X, lengths, init: Params, reps: int) -> dict | str:
    try:
        from semiring_ops import HMM
    except ImportError as exc:
        return f"ours unavailable ({exc})"
    C, V = init.emissionprob.shape
    model = HMM(C, "categorical", n_symbols=V).to(dtype=dtype)

    def reset():
        model.startprob_, model.transmat_, model.emissionprob_ = init.startprob, init.transmat, init.emissionprob

    out = {
        "em": guarded(lambda: median_ms(lambda: model.fit(X, lengths, n_iter=1, tol=0.0), reps, reset)),
        "score": guarded(lambda: median_ms(lambda: model.score(X, lengths), reps, reset)),
        "decode": guarded(lambda: median_ms(lambda: model.decode(X, lengths), reps, reset)),
    }
    with contextlib.suppress(Exception):
        reset()
        ll = float(model.score(X, lengths))
        path = np.asarray(model.decode(X, lengths)[1].cpu())
        model.fit(X, lengths, n_iter=1, tol=0.0)
        out["check"] = {"loglik": ll, "path": path, "transmat": np.asarray(model.transmat_.double().cpu())}
    return out


def bench_hmmlearn(implementation: str, X, lengths, init: Params, reps: int) -> dict | str:
    try:
        from hmmlearn.hmm import CategoricalHMM
    except ImportError:
        return "unavailable"
    logging.getLogger("hmmlearn").setLevel(logging.ERROR)
    C, V = init.emissionprob.shape
    model = CategoricalHMM(C, n_features=V, n_iter=1, tol=0.0, init_params="", implementation=implementation)

    def reset():
        model.startprob_, model.transmat_ = init.startprob.copy(), init.transmat.copy()
        model.emissionprob_ = init.emissionprob.copy()

    out = {
        "em": guarded(lambda: median_ms(lambda: model.fit(X, lengths), reps, reset)),
        "score": guarded(lambda: median_ms(lambda: model.score(X, lengths), reps, reset)),
        "decode": guarded(lambda: median_ms(lambda: model.decode(X, lengths), reps, reset)),
    }
    reset()
    ll, path = model.score(X, lengths), model.decode(X, lengths)[1]
    model.fit(X, lengths)
    out["check"] = {"loglik": ll, "path": path, "transmat": model.transmat_.copy()}
    return out


def bench_pomegranate(X3, init: Params, reps: int) -> dict | str:
    try:
        from pomegranate.distributions import Categorical
        from pomegranate.hmm import DenseHMM
    except ImportError:
        return "unavailable"
    warnings.filterwarnings("ignore", module="pomegranate")
    C = len(init.startprob)
    f32 = lambda a: torch.tensor(a, dtype=torch.float32)  # noqa: E731
    box = {}

    def build():
        box["m"] = DenseHMM(
            [Categorical(f32(init.emissionprob[c : c + 1])) for c in range(C)],
            edges=f32(init.transmat),
            starts=f32(init.startprob),
            ends=torch.ones(C),
            max_iter=1,
            tol=0.0,
        )

    Xt = torch.as_tensor(X3)
    out = {
        "em": guarded(lambda: median_ms(lambda: box["m"].fit(Xt), reps, build)),
        "score": guarded(lambda: median_ms(lambda: box["m"].log_probability(Xt), reps, build)),
        "decode": guarded(lambda: median_ms(lambda: box["m"].viterbi(Xt), reps, build)),
    }
    with contextlib.suppress(Exception):
        build()
        out["check"] = {
            "loglik": float(box["m"].log_probability(Xt).double().sum()),
            "path": box["m"].viterbi(Xt).reshape(-1).numpy(),
        }
    return out


# ---------------------------------------------------------------- table

HEADER = ("system", "dtype", "EM iter ms", "score ms", "decode ms", "EM x", "score x", "decode x")
WIDTHS = (22, 7, 11, 9, 10, 7, 8, 9)


def _fmt(v) -> str:
    return f"{v:.2f}" if isinstance(v, float) else ("-" if v is None else str(v))


def _line(cells) -> str:
    return " ".join(f"{c:<{w}s}" if i < 2 else f"{c:>{w}s}" for i, (c, w) in enumerate(zip(cells, WIDTHS, strict=True)))


def _ratio(num, den) -> str:
    return f"{num / den:.2f}x" if isinstance(num, float) and isinstance(den, float) else "-"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--states", type=int, default=50)
    parser.add_argument("--symbols", type=int, default=20)
    parser.add_argument("--sequences", type=int, default=200)
    parser.add_argument("--length", type=int, default=50)
    parser.add_argument("--reps", type=int, default=7, help="timed runs per cell (after 2 warm-up runs)")
    parser.add_argument("--threads", type=int, default=os.cpu_count(), help="torch threads (default: all cores)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-fp64", action="store_true", help="skip our float64 row")
    parser.add_argument("--json", default=None, metavar="PATH", help="also write the rows as JSON")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    C, V, N, T = args.states, args.symbols, args.sequences, args.length
    rng = np.random.default_rng(args.seed)
    truth, init = random_params(rng, C, V), random_params(rng, C, V)
    seqs = sample(rng, truth, N, T)
    X, lengths, X3 = seqs.reshape(-1, 1), [T] * N, seqs[..., None]

    import hmmlearn

    versions = {"torch": torch.__version__, "hmmlearn": hmmlearn.__version__}
    with contextlib.suppress(Exception):
        from importlib.metadata import version

        versions["pomegranate"] = version("pomegranate")
    print(
        f"CPU: {os.cpu_count()} cores, torch threads {torch.get_num_threads()} | "
        + " ".join(f"{k} {v}" for k, v in versions.items())
    )
    load = os.getloadavg()[0]
    if load > (os.cpu_count() or 1) - 0.5:
        print(
            f"WARNING: load average {load:.1f} on {os.cpu_count()} cores: other processes compete; times are inflated"
        )
    print(f"categorical HMM: {C} states, {V} symbols, {N} sequences x {T} steps; medians of {args.reps} runs")

    results: dict[str, tuple[str, dict | str]] = {}
    results["ours"] = ("fp32", bench_ours(torch.float32, X, lengths, init, args.reps))
    if not args.no_fp64:
        results["ours (fp64)"] = ("fp64", bench_ours(torch.float64, X, lengths, init, args.reps))
    results["hmmlearn (log)"] = ("fp64", bench_hmmlearn("log", X, lengths, init, args.reps))
    results["hmmlearn (scaling)"] = ("fp64", bench_hmmlearn("scaling", X, lengths, init, args.reps))
    results["pomegranate"] = ("fp32", bench_pomegranate(X3, init, args.reps))

    anchors = {k: v for k, (_, v) in results.items() if not k.startswith("ours") and isinstance(v, dict)}

    def best_anchor(key: str) -> tuple[str, float] | None:
        timed = [(name, r[key]) for name, r in anchors.items() if isinstance(r[key], float)]
        return min(timed, key=lambda x: x[1]) if timed else None

    ours = results["ours"][1]
    keys = ("em", "score", "decode")
    print(_line(HEADER))
    print("-" * len(_line(HEADER)))
    rows = []
    for name, (dtype, r) in results.items():
        if isinstance(r, str):
            print(_line((name, dtype, r, "", "", "", "", "")))
            rows.append({"system": name, "dtype": dtype, "status": r})
            continue
        if name.startswith("ours"):  # the faster anchor / ours
            ratios = [_ratio(b[1], r[k]) if (b := best_anchor(k)) else "-" for k in keys]
        else:
            ratios = [_ratio(r[k], ours[k]) if isinstance(ours, dict) else "-" for k in keys]
        print(_line((name, dtype, *(_fmt(r[k]) for k in keys), *ratios)))
        rows.append({"system": name, "dtype": dtype, **{f"{k}_ms": r[k] for k in keys}})

    print("checks (against hmmlearn (log), same starting parameters):")
    ref = anchors.get("hmmlearn (log)", {}).get("check")
    for name, (_, r) in results.items():
        if name == "hmmlearn (log)" or not isinstance(r, dict) or "check" not in r or ref is None:
            continue
        c = r["check"]
        parts = [f"log-likelihood diff {c['loglik'] - ref['loglik']:+.3g} (of {ref['loglik']:.6g})"]
        parts.append(f"Viterbi states identical {np.mean(c['path'] == ref['path']):.1%}")
        if "transmat" in c:
            parts.append(f"transmat after 1 EM iter max |diff| {np.abs(c['transmat'] - ref['transmat']).max():.2e}")
        print(f"  {name}: " + "; ".join(parts))

    if isinstance(ours, dict) and isinstance(ours["em"], float) and (b := best_anchor("em")):
        speedup = b[1] / ours["em"]
        verdict = "MET" if speedup >= TARGET else "NOT MET"
        print(
            f"target: EM iteration >= {TARGET:.0f}x faster than the faster anchor ({b[0]}, {b[1]:.2f} ms): "
            f"ours fp32 {ours['em']:.2f} ms = {speedup:.2f}x -> {verdict}"
        )
    elif isinstance(ours, str):
        print(ours)
    if args.json:
        meta = {"cores": os.cpu_count(), "threads": torch.get_num_threads(), "C": C, "V": V, "N": N, "T": T}
        Path(args.json).write_text(json.dumps({"meta": {**meta, **versions}, "rows": rows}, indent=1))
        print("wrote", args.json)


if __name__ == "__main__":
    main()
