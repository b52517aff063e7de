"""How long a user waits for the kernels: each first call in a fresh process with a cold cache (the family it
needs is compiled then), the same call again with the cache warm, and everything built at once.

    python benchmarks/first_use.py                  # cuda when there is a GPU, else cpu
    python benchmarks/first_use.py --device cpu --json first_use.json

Rows (each a new Python process; "cold": an empty SEMIRING_OPS_CACHE, "warm": the cache the cold run left):
  first logbmm     import + logbmm forward and backward (B=8, n=k=m=1024 on a GPU; B=4, 128 on the CPU)
  first CRF step   import + one LinearChainCRF training step, loss and backward ((32, 128) tokens, 32 tags)
  build all        python -m semiring_ops build: every family of the device type, in parallel
Reported: seconds of the whole process (import, compile, the call) and the compile it waited for (the families'
builds, from the cache's ninja logs). Where a family took the NVRTC route (no CUDA toolkit; docs/build.md), its
kernels compile on their first launch: "NVRTC" counts those compiles, and "kernels cold s" is a third run with the
family's host code cached and the kernels' cache emptied (what a user of a wheel without the GPU's kernels waits).
On the CPU a first call also starts the family's C++ autograd module, built
by a worker process in the background (families.py, "autograd modules"): "then" is that build, which the cold
process does not wait for; the warm run starts once it has ended. The toolkit used is printed (`python -m
semiring_ops info` chooses it).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SCENARIOS = {
    "first logbmm": """
import torch, semiring_ops as so
d = "{device}"
B, n = (8, 1024) if d == "cuda" else (4, 128)
g = torch.Generator(device=d).manual_seed(0)
a = torch.randn(B, n, n, device=d, generator=g, requires_grad=True)
b = torch.randn(B, n, n, device=d, generator=g, requires_grad=True)
so.logbmm(a, b).sum().backward()
if d == "cuda": torch.cuda.synchronize()
""",
    "first CRF step": """
import torch, semiring_ops as so
d = "{device}"
g = torch.Generator(device=d).manual_seed(0)
crf = so.LinearChainCRF(32, batch_first=True).to(d)
em = torch.randn(32, 128, 32, device=d, generator=g, requires_grad=True)
tags = torch.randint(0, 32, (32, 128), device=d, generator=g)
loss = -crf(em, tags)
loss.backward()
if d == "cuda": torch.cuda.synchronize()
""",
}


def _compile_seconds(cache: Path, autograd: bool = False) -> float:
    """Wall time of the families built into `cache`, from their ninja logs (first start to last end per family,
    summed over families built one after the other): the kernels' families, or with `autograd` the autograd
    modules built in the background."""
    total = 0.0
    for log in cache.glob("semiring_ops_*/.ninja_log"):
        if log.parent.name.split("-")[0].endswith("_autograd") != autograd:
            continue
        rows = [line.split("\t") for line in log.read_text().splitlines()[1:] if line.strip()]
        if rows:
            total += (max(int(r[1]) for r in rows) - min(int(r[0]) for r in rows)) / 1000
    return total


def _wait_for_background_builds(cache: Path, timeout: float = 600.0) -> None:
    """Until every build folder in `cache` has its marker (an autograd module's worker outlives the cold process)."""
    deadline = time.monotonic() + timeout
    while any(not (d / "build.ok").is_file() for d in cache.glob("semiring_ops_*") if d.is_dir()):
        if time.monotonic() > deadline:
            raise SystemExit(f"a background build in {cache} did not end within {timeout:.0f} s")
        time.sleep(0.2)


def _run(cmd: list[str], cache: Path) -> tuple[float, str]:
    env = {**os.environ, "SEMIRING_OPS_CACHE": str(cache)}
    t0 = time.perf_counter()
    res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1800)
    seconds = time.perf_counter() - t0
    if res.returncode != 0:
        raise SystemExit(f"{' '.join(cmd[:3])} failed:\n{res.stdout[-4000:]}\n{res.stderr[-4000:]}")
    return seconds, res.stderr


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=["cpu", "cuda"], default=None)
    parser.add_argument("--json", default=None, help="write the rows here")
    parser.add_argument(
        "--build-into", default=None, help="run 'build all' into this cache (kept) instead of a fresh one"
    )
    parser.add_argument(
        "--no-build-all", action="store_true", help="leave out 'build all' (a wheel's user, with no compiler)"
    )
    args = parser.parse_args()
    import torch

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    info = subprocess.run([sys.executable, "-m", "semiring_ops", "info"], capture_output=True, text=True).stdout
    print("\n".join(line for line in info.splitlines() if line.startswith(("semiring_ops", "C++", "CUDA"))))
    print(
        f"{os.cpu_count()} CPU cores; device {device}"
        + (f" ({torch.cuda.get_device_name()})" if device == "cuda" else "")
    )
    rows = []
    head = f"{'call':16s} {'cold s':>8s} {'compile s':>10s} {'then s':>8s} {'warm s':>8s}"
    print(f"{head} {'NVRTC':>6s} {'kernels cold s':>15s}")
    for name, body in SCENARIOS.items():
        with tempfile.TemporaryDirectory(prefix="so_first_use_") as tmp:
            cache = Path(tmp)
            cmd = [sys.executable, "-c", body.format(device=device)]
            cold, err = _run(cmd, cache)
            nvrtc_compiles = err.count(" with NVRTC ")
            _wait_for_background_builds(cache)
            compiled, then = _compile_seconds(cache), _compile_seconds(cache, autograd=True)
            warm, _ = _run(cmd, cache)
            kernels_cold = None
            if (cache / "nvrtc").is_dir():  # the NVRTC route: its kernels cold again, the host code cached
                shutil.rmtree(cache / "nvrtc")
                kernels_cold, _ = _run(cmd, cache)
            families = sorted(
                p.name.split("-")[0].removeprefix("semiring_ops_") for p in cache.glob("semiring_ops_*") if p.is_dir()
            )
        rows.append(
            {
                "call": name,
                "cold_s": cold,
                "compile_s": compiled,
                "background_s": then,
                "warm_s": warm,
                "nvrtc_compiles": nvrtc_compiles,
                "kernels_cold_s": kernels_cold,
                "families": families,
            }
        )
        nv = f"{nvrtc_compiles:6d} {kernels_cold:15.1f}" if kernels_cold is not None else f"{'':6s} {'':15s}"
        print(f"{name:16s} {cold:8.1f} {compiled:10.1f} {then:8.1f} {warm:8.1f} {nv}   built: {', '.join(families)}")
    with tempfile.TemporaryDirectory(prefix="so_first_use_") as tmp:
        if args.no_build_all:
            return _write(args.json, device, rows)
        target = Path(args.build_into) if args.build_into else Path(tmp)
        if any(target.glob("semiring_ops_*")):
            raise SystemExit(f"--build-into {target} is not empty: 'build all' must start from a cold cache")
        cmd = [sys.executable, "-m", "semiring_ops", "build", "--device", device]
        if device == "cuda":
            cmd[-1:] = ["cpu", "cuda"]
        whole, _ = _run(cmd, target)
    rows.append({"call": "build all", "cold_s": whole, "devices": cmd[cmd.index("--device") + 1 :]})
    print(f"{'build all':16s} {whole:8.1f}   ({' + '.join(cmd[cmd.index('--device') + 1 :])} families, in parallel)")
    _write(args.json, device, rows)


def _write(path: str | None, device: str, rows: list[dict]) -> None:
    if path:
        Path(path).write_text(json.dumps({"device": device, "cores": os.cpu_count(), "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
