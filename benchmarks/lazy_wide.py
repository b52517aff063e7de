"""A wide formula's first and warm call (issue 30 item 6): KeOps' k-NN on MNIST-shaped data, ours and pykeops's.

``((x_i - y_j) ** 2).sum(-1).argKmin(K, dim=1)`` with x (M, D), y (N, D) standard normal, D = 784 by default. Each
system runs in a fresh process with an empty kernel cache, so its first call includes its compilation; then the
best of --reps warm calls. The indices are checked against float64 torch.

Usage:
    python benchmarks/lazy_wide.py                  # CPU, M = 100, N = 1000, D = 784, K = 10
    python benchmarks/lazy_wide.py --device cuda --unrolled   # and ours with the former unrolled emission
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile

_CHILD = r"""
import json, os, sys, time, torch
system, device, m, n, d, k, reps, unrolled = sys.argv[1:9]
m, n, d, k, reps = int(m), int(n), int(d), int(k), int(reps)
if unrolled == "1":  # the emission before issue 30 item 6: every component its statement, in post-order
    import semiring_ops.lazy.formula as F
    import semiring_ops.lazy.wide as W
    F.WIDE_STATEMENTS = F.WIDE_COMPONENTS = W.WIDE_COMPONENTS = 10**9
if system == "pykeops":
    import pykeops
    pykeops.set_build_folder(os.environ["WIDE_CACHE"])
    from pykeops.torch import LazyTensor
else:
    from semiring_ops.lazy import LazyTensor
g = torch.Generator().manual_seed(0)
x, y = torch.randn(m, d, generator=g).to(device), torch.randn(n, d, generator=g).to(device)
D = ((LazyTensor(x[:, None, :]) - LazyTensor(y[None, :, :])) ** 2).sum(-1)
def run():
    out = D.argKmin(k, dim=1)
    if device != "cpu":
        torch.cuda.synchronize()
    return out
t = time.perf_counter(); idx = run(); first = time.perf_counter() - t
warm = []
for _ in range(reps):
    t = time.perf_counter(); run(); warm.append(time.perf_counter() - t)
want = torch.cdist(x.double(), y.double()).topk(k, largest=False).indices
print(json.dumps({"first": first, "warm": min(warm), "same": bool(torch.equal(idx.long().cpu(), want.cpu()))}))
"""


def measure(system: str, args: argparse.Namespace) -> dict | None:
    with tempfile.TemporaryDirectory() as cache:
        env = dict(os.environ, SEMIRING_OPS_CACHE=cache, WIDE_CACHE=cache)
        argv = [system.split()[0], args.device, args.m, args.n, args.d, args.k, args.reps, int("unrolled" in system)]
        proc = subprocess.run(
            [sys.executable, "-c", _CHILD, *map(str, argv)], env=env, capture_output=True, text=True, timeout=900
        )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["?"]
        print(f"{system}: failed ({tail[0][:200]})", file=sys.stderr)
        return None
    return json.loads(lines[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--m", type=int, default=100)
    parser.add_argument("--n", type=int, default=1000)
    parser.add_argument("--d", type=int, default=784)
    parser.add_argument("--k", type=int, default=10)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--unrolled", action="store_true", help="also time ours with the former unrolled emission")
    args = parser.parse_args()
    shape = f"M = {args.m}, N = {args.n}, D = {args.d}"
    print(f"argKmin({args.k}) of |x_i - y_j|^2, {shape}, {args.device}, {datetime.date.today()}")
    print("| system | first call s (compile included) | warm ms | indices = float64 |")
    print("|---|---|---|---|")
    systems = ["semiring_ops", "pykeops"]
    if args.unrolled:
        systems.insert(1, "semiring_ops (unrolled)")
    for system in systems:
        r = measure(system, args)
        if r is None:
            print(f"| {system} | - | - | - |")
            continue
        print(f"| {system} | {r['first']:.2f} | {r['warm'] * 1e3:.1f} | {r['same']} |")


if __name__ == "__main__":
    main()
