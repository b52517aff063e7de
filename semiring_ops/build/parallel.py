"""``python -m semiring_ops build``: every kernel family compiled into the cache at once, one process per family.

Families run side by side while the compile jobs they ask for (one per source file, at most ``jobs``) fit in
``jobs`` (the CPU count by default), the largest first; each family's ninja gets MAX_JOBS = its share. A family
already in the cache, or served by a matching wheel, is skipped. The cache's locks make this safe beside other
processes that build on first use: whoever comes second waits and loads.

    python -m semiring_ops.build.parallel cuda chain     # one family (what each worker process runs)
    python -m semiring_ops.build.parallel cpu bmm_autograd 10   # the same at nice 10 (start_background_build)
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

from .families import Family, family

__all__ = ["FamilyBuild", "build_families", "start_background_build"]


@dataclass
class FamilyBuild:
    family: Family
    status: str  # compiled | cached | prebuilt | failed | skipped
    seconds: float = 0.0
    detail: str = ""


def _jobs_for(fam: Family, jobs: int) -> int:
    return max(1, min(len(fam.sources), jobs))


def build_families(
    fams: list[Family], jobs: int | None = None, echo=print, use_prebuilt: bool = True
) -> list[FamilyBuild]:
    """Compiles `fams` into the cache in parallel worker processes; one line per family through `echo` as each ends.
    A family a matching wheel serves is skipped, unless `use_prebuilt` is False (setup.py, building that wheel)."""
    from . import backends, jit, prebuilt

    jobs = jobs or os.cpu_count() or 1
    width = max((len(fam.name) for fam in fams), default=0)  # the families' column, as wide as its longest name
    results: list[FamilyBuild] = []
    pending: list[Family] = []
    for fam in fams:
        device_index = 0 if fam.device_type == "cuda" and _has_gpu() else None
        if use_prebuilt and prebuilt.prebuilt_status(fam, device_index)[0] == "prebuilt":
            results.append(FamilyBuild(fam, "prebuilt"))
            continue
        spec, tk = backends.jit_build(fam, building=True)
        if jit.is_cached(spec, tk):
            results.append(FamilyBuild(fam, "cached"))
            continue
        problem = backends._toolchain_problem(fam.device_type, spec.nvrtc)
        if problem is not None:
            results.append(FamilyBuild(fam, "skipped", detail=problem[0]))
            continue
        pending.append(fam)
    for r in results:
        echo(f"  {r.family.device_type:4s} {r.family.name:{width}s} {r.status}{': ' + r.detail if r.detail else ''}")
    pending.sort(key=lambda f: -len(f.sources))
    running: list[tuple[Family, subprocess.Popen, float, int]] = []  # (family, worker, start, its jobs)
    while pending or running:
        used = sum(share for *_, share in running)
        started = False
        for fam in list(pending):
            share = _jobs_for(fam, jobs)
            if not running or used + share <= jobs:
                running.append((fam, _start(fam, share), time.perf_counter(), share))
                pending.remove(fam)
                used += share
                started = True
        if not started:
            time.sleep(0.05)
        for item in list(running):
            fam, proc, t0, _ = item
            if proc.poll() is None:
                continue
            running.remove(item)
            proc.log.seek(0)
            err = proc.log.read()
            proc.log.close()
            seconds = time.perf_counter() - t0
            if proc.returncode == 0:
                result = FamilyBuild(fam, "compiled", seconds)
            else:
                tail = "\n".join(line for line in err.strip().splitlines()[-12:])
                result = FamilyBuild(fam, "failed", seconds, tail)
            results.append(result)
            echo(
                f"  {fam.device_type:4s} {fam.name:{width}s} {result.status} in {seconds:.1f} s"
                + (f"\n{result.detail}" if result.detail else "")
            )
    return results


def _has_gpu() -> bool:
    import torch

    return torch.cuda.is_available()


def _start(fam: Family, share: int, nice: int = 0) -> subprocess.Popen:
    """A worker process building `fam` with `share` compile jobs (at `nice` lower priority); its stderr goes to a
    temporary file (a pipe read only at the end could fill up with compiler output and stall the worker), kept as
    proc.log."""
    env = {**os.environ, "MAX_JOBS": str(share)}
    cmd = [sys.executable, "-m", "semiring_ops.build.parallel", fam.device_type, fam.name, str(nice)]
    log = tempfile.TemporaryFile("w+")  # noqa: SIM115 (closed when the worker has been waited for)
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=log, text=True)
    proc.log = log  # type: ignore[attr-defined]
    return proc


def start_background_build(fam: Family) -> subprocess.Popen:
    """`fam` built by a worker process at low priority (one compile job, nice $SEMIRING_OPS_BACKGROUND_NICE, 10 by
    default), so that it takes what the caller's own work leaves of the CPU; the build keeps its lock on the cache
    folder should the caller exit first. Its stderr is proc.log, which the caller reads and closes once it has waited
    for it."""
    return _start(fam, 1, nice=int(os.environ.get("SEMIRING_OPS_BACKGROUND_NICE", "10")))


def _build_one(device_type: str, name: str, nice: int = 0) -> None:
    from . import backends, jit

    if nice:
        os.nice(nice)
    jit.load(*backends.jit_build(family(device_type, name), building=True))


if __name__ == "__main__":
    _build_one(sys.argv[1], sys.argv[2], int(sys.argv[3]) if len(sys.argv) > 3 else 0)
