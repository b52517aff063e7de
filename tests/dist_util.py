"""Runs a function on several CPU ranks of a gloo process group, each in a spawned process, under a timeout:
a hang or a crash fails the calling test within ``timeout`` seconds instead of eating CI's time.

    results = run_ranks(fn, world_size, *args, timeout=120)            # gloo, CPU
    results = run_ranks(fn, 2, *args, backend="nccl")                   # NCCL, rank r on cuda:r

``fn(rank, world_size, *args)`` must be a module-level function (it is pickled by reference); it runs after
``torch.distributed.init_process_group("gloo", ...)`` (the default group is the world) and its return value
(tensors, numbers, anything picklable) comes back in rank order. An exception in any rank is raised here
with that rank's traceback.
"""

from __future__ import annotations

import datetime
import io
import os
import queue
import socket
import traceback
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

__all__ = ["run_ranks"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_main(
    rank: int, world: int, port: int, timeout: float, fn: Callable, args: tuple, out: Any, backend: str
) -> None:
    try:
        torch.set_num_threads(1)  # several ranks share the CI machine's cores
        extra = {}
        if backend == "nccl":  # rank r on cuda:r; NVLink SHARP / multicast off on the lent machines
            os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
            os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
            torch.cuda.set_device(rank)
            extra["device_id"] = torch.device("cuda", rank)
        dist.init_process_group(
            backend,
            init_method=f"tcp://127.0.0.1:{port}",
            rank=rank,
            world_size=world,
            timeout=datetime.timedelta(seconds=timeout),
            **extra,
        )
        try:
            buffer = io.BytesIO()  # by value: a tensor sent as is would be a shared-memory handle, gone with
            torch.save(fn(rank, world, *args), buffer)  # this process if it exits before the parent reads it
            out.put((rank, True, buffer.getvalue()))
        finally:
            dist.destroy_process_group()
    except BaseException:  # reported to the parent, which raises it
        out.put((rank, False, traceback.format_exc()))


def run_ranks(fn: Callable, world_size: int, *args: Any, timeout: float = 120.0, backend: str = "gloo") -> list[Any]:
    """fn(rank, world_size, *args) on ``world_size`` ranks of ``backend`` (gloo; "nccl": rank r on cuda:r);
    their results in rank order (module doc)."""
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    port = _free_port()
    procs = [
        ctx.Process(target=_rank_main, args=(r, world_size, port, timeout, fn, args, out, backend), daemon=True)
        for r in range(world_size)
    ]
    for p in procs:
        p.start()
    results: dict[int, Any] = {}
    errors: list[str] = []
    try:
        for _ in range(world_size):
            try:
                rank, ok, value = out.get(timeout=timeout + 60)  # + process start and imports
            except queue.Empty:
                raise TimeoutError(
                    f"run_ranks: {world_size - len(results) - len(errors)} rank(s) gave no result within "
                    f"{timeout + 60:.0f} s (a hang or a crash)"
                ) from None
            if ok:
                results[rank] = torch.load(io.BytesIO(value), weights_only=False)
            else:
                errors.append(f"rank {rank}:\n{value}")
    finally:
        for p in procs:
            p.join(5)
            if p.is_alive():
                p.kill()
                p.join()
    if errors:
        raise RuntimeError("run_ranks: a rank failed\n" + "\n".join(errors))
    return [results[r] for r in range(world_size)]
