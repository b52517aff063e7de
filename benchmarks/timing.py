"""Timing used by every benchmark: median of many runs after warm-up; CUDA events on the GPU."""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable

import torch


def time_ms(fn: Callable[[], object], device: str, reps: int) -> float:
    """Median milliseconds of fn() after warm-up."""
    for _ in range(3):
        fn()
    settle(device)
    return statistics.median(timed_runs(fn, device, reps))


def paired_ms(fns: list[Callable[[], object]], device: str, reps: int) -> list[float]:
    """Median milliseconds of each function, timed in alternation (one call of each per round, after warm-up),
    so drift in the machine's state (clocks, other load) falls on all of them alike: for ratios near 1."""
    for fn in fns:
        for _ in range(3):
            fn()
    settle(device)
    times: list[list[float]] = [[] for _ in fns]
    for _ in range(reps):
        for fn, t in zip(fns, times, strict=True):
            t.extend(timed_runs(fn, device, 1))
    return [statistics.median(t) for t in times]


def settle(device: str) -> None:
    """After warm-up: the lazy kernels' background compiles done (their quick tier swapped for the optimised one,
    semiring_ops.lazy.nvrtc) and the device idle, so that the timed runs see the kernels that stay."""
    nvrtc = sys.modules.get("semiring_ops.lazy.nvrtc")
    if nvrtc is not None:
        nvrtc.wait_for_optimized()
    if device == "cuda":
        torch.cuda.synchronize()


def timed_runs(fn: Callable[[], object], device: str, reps: int) -> list[float]:
    """Milliseconds of each of ``reps`` calls of fn() (no warm-up): CUDA events around each call on the
    GPU, the wall clock on the CPU."""
    times = []
    for _ in range(reps):
        if device == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
    return times


def loop_ms(fn: Callable[[], object], device: str, reps: int, loops: int = 3) -> float:
    """Milliseconds a call of fn() takes in a loop of ``reps`` calls back to back, as a training loop makes them
    (the host's work for one call overlaps the device's for the one before): the median of ``loops`` loops timed
    as timed_runs times a call, after warm-up."""
    for _ in range(3):
        fn()
    settle(device)

    def loop() -> None:
        for _ in range(reps):
            fn()

    return statistics.median(timed_runs(loop, device, loops)) / reps


def synced_wall_ms(fn: Callable[[], object], device: str) -> float:
    """Wall-clock milliseconds of one call of fn(), the device synchronised before and after it."""
    if device == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn()
    if device == "cuda":
        torch.cuda.synchronize()
    return (time.perf_counter() - t0) * 1e3


def best_wall_ms(fn: Callable[[], object], device: str, reps: int) -> float:
    """The fastest of ``reps`` calls of fn() after one warm-up call, in wall-clock milliseconds, the device
    synchronised before and after each call: host time included, for calls small enough to be host-bound."""
    fn()
    return min(synced_wall_ms(fn, device) for _ in range(reps))


def paired_wall_ms(fns: list[Callable[[], object]], device: str, rounds: int) -> list[float]:
    """Median wall-clock milliseconds of each function over ``rounds`` rounds of one call of each in turn (after
    a warm-up call of each), the device synchronised before and after every call: for host-bound calls on a
    noisy host, whose bursts then fall on every function alike."""
    for fn in fns:
        fn()
    times: list[list[float]] = [[] for _ in fns]
    for _ in range(rounds):
        for fn, t in zip(fns, times, strict=True):
            t.append(synced_wall_ms(fn, device))
    return [statistics.median(t) for t in times]


def graphed(fn: Callable[[], object], warmup: int = 3) -> Callable[[], None]:
    """fn captured in a CUDA graph after warm-up calls on a side stream (as torch.cuda.graph asks) -> a
    function that replays it: the same kernels on the same buffers, without Python or launch overhead."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(warmup):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph.replay


def release(device: str) -> None:
    """Returns the caching allocator's free blocks (CUDA), so one system's peak does not starve the next."""
    if device == "cuda":
        torch.cuda.empty_cache()


def time_or_failure(fn: Callable[[], object], device: str, reps: int) -> float | str:
    """time_ms, or 'OOM' / 'ERR <type>: <message>' when fn fails; releases cached memory afterwards."""
    try:
        return time_ms(fn, device, reps)
    except torch.cuda.OutOfMemoryError:
        return "OOM"
    except Exception as exc:
        return f"ERR {type(exc).__name__}: {str(exc)[:60]}"
    finally:
        release(device)


def peak_mib(step: Callable[[], object], device: str) -> float | str | None:
    """MiB allocated at the peak of one step() above what was allocated before it (CUDA only)."""
    if device != "cuda":
        return None
    try:
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        step()
        torch.cuda.synchronize()
        return (torch.cuda.max_memory_allocated() - base) / 2**20
    except torch.cuda.OutOfMemoryError:
        return "OOM"
    except Exception as exc:
        return f"ERR {type(exc).__name__}"
    finally:
        release(device)
