"""Demo: Baum-Welch EM for a categorical HMM (semiring_ops.HMM), checked against the truth.

Draws sequences from a known HMM, fits a second one by EM from a random start (hmmlearn's calls:
``fit(X, lengths)``, ``predict``), matches the learned states to the true ones (the best assignment of
emission rows), then prints the learned against the true parameters, the decoding accuracy against the
true states and against the true model's own Viterbi paths, and the seconds per EM iteration.

Usage: python examples/hmm_em.py [--device cuda] [--states 4] [--symbols 6] [--sequences 200] [--length 50]
"""

from __future__ import annotations

import argparse
import itertools
import time

import torch

from semiring_ops import HMM


def true_model(C: int, V: int, device: torch.device, g: torch.Generator) -> HMM:
    """Sticky transitions (0.8 on the diagonal); state c emits symbol c (mod V) about half the time."""
    trans = torch.full((C, C), 0.2 / max(C - 1, 1), dtype=torch.float64)
    trans.fill_diagonal_(0.8 if C > 1 else 1.0)
    own = torch.zeros(C, V, dtype=torch.float64)
    own[torch.arange(C), torch.arange(C) % V] = V / 2
    emis = torch.rand(C, V, generator=g, dtype=torch.float64) + own
    emis /= emis.sum(1, keepdim=True)
    model = HMM(C, n_symbols=V).to(device=device, dtype=torch.float64)
    model.startprob_, model.transmat_, model.emissionprob_ = torch.full((C,), 1.0 / C), trans, emis
    return model


def match_states(learned: torch.Tensor, truth: torch.Tensor) -> list[int]:
    """perm[i] = the learned state matching true state i: the assignment minimising the L1 distance
    between emission rows, exact by enumeration up to 8 states, greedy beyond."""
    cost = torch.cdist(truth, learned, p=1).cpu()
    C = cost.shape[0]
    if C <= 8:
        best = min(itertools.permutations(range(C)), key=lambda p: sum(cost[i, p[i]].item() for i in range(C)))
        return list(best)
    perm, free = [-1] * C, set(range(C))
    for i, j in sorted(itertools.product(range(C), repeat=2), key=lambda ij: cost[ij].item()):
        if perm[i] < 0 and j in free:
            perm[i] = j
            free.discard(j)
    return perm


def show(name: str, learned: torch.Tensor, truth: torch.Tensor) -> None:
    print(f"\n{name}: learned | true   (max abs error {(learned - truth).abs().max().item():.3f})")
    for a, b in zip(learned.reshape(len(learned), -1).tolist(), truth.reshape(len(truth), -1).tolist(), strict=True):
        print("  " + " ".join(f"{v:.2f}" for v in a) + "  |  " + " ".join(f"{v:.2f}" for v in b))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--states", type=int, default=4)
    parser.add_argument("--symbols", type=int, default=6)
    parser.add_argument("--sequences", type=int, default=200)
    parser.add_argument("--length", type=int, default=50)
    parser.add_argument("--iters", type=int, default=300)
    parser.add_argument("--tol", type=float, default=1e-2)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    device = torch.device(args.device)
    C, V, B, T = args.states, args.symbols, args.sequences, args.length
    g = torch.Generator().manual_seed(args.seed)

    truth = true_model(C, V, device, g)
    x, z = truth.sample_batch(B, T, generator=args.seed)
    X, states, lengths = x.reshape(B * T, 1), z.reshape(B * T), [T] * B  # hmmlearn's concatenated layout
    print(f"{B} sequences x {T} steps from a {C}-state, {V}-symbol HMM on {device}")
    print(f"log-likelihood under the true model: {truth.score(X, lengths).item():.4f}\n")

    model = HMM(C, n_symbols=V, generator=g).to(device=device, dtype=torch.float64)
    print(f"{'iteration':>10} {'log-likelihood':>16} {'gain':>16} {'seconds':>10}")
    tic = time.perf_counter()
    model.fit(X, lengths, n_iter=args.iters, tol=args.tol, verbose=True)
    seconds = time.perf_counter() - tic
    monitor = model.monitor_
    print(f"\nEM: {monitor.iter} iterations, converged={monitor.converged}, {seconds / monitor.iter * 1e3:.1f} ms each")
    print(f"log-likelihood under the learned model: {model.score(X, lengths).item():.4f}")

    perm = match_states(model.emissionprob_, truth.emissionprob_)
    show("start probabilities", model.startprob_[perm], truth.startprob_)
    show("transition matrix", model.transmat_[perm][:, perm], truth.transmat_)
    show("emission probabilities", model.emissionprob_[perm], truth.emissionprob_)

    to_true = torch.empty(C, dtype=torch.long, device=device)
    to_true[torch.tensor(perm, device=device)] = torch.arange(C, device=device)
    decoded = to_true[model.predict(X, lengths)]
    oracle = truth.predict(X, lengths)

    def rate(a: torch.Tensor, b: torch.Tensor) -> str:
        return f"{(a == b).double().mean().item():.3f}"

    print(f"\nViterbi accuracy against the true states: learned model {rate(decoded, states)}, ", end="")
    print(f"true model {rate(oracle, states)}")
    print(f"agreement of the learned model's Viterbi paths with the true model's: {rate(decoded, oracle)}")


if __name__ == "__main__":
    main()
