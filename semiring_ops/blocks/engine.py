"""The block engine's orchestration: blocks of a plan (scheduler.py) computed on a pool of devices and written
into a host output, whatever the operation (a policy, policies.py) and the output's layout (a writer,
writers.py).

- **Devices.** One worker thread per device, all taking blocks from one queue, largest first, as they free
  up. ``"cpu"`` workers compute blocks directly (the CPU path: the same scheduler and queue, so the
  orchestration is tested where there is no GPU).
- **Pipeline per GPU.** A ring of STAGING_SLOTS pinned staging chunks (STAGING_CHUNK_BYTES each), each
  with an event: block k is computed on the worker's compute stream and downloaded in row ranges of at most
  a chunk on a copy stream, while the host writes the oldest chunk into the output (a multi-threaded copy)
  and block k + 1 computes. A chunk is reused only after the host has written what it held. The pinned
  memory is a few chunks whatever the block size (pinning is slow: about 3 GB/s), and torch's pinned
  allocator keeps it for the next call.
- **Faults.** A block that runs out of device memory is split in two (its longer side halved) and its
  halves are computed in its place. An exception in any worker stops the others at their next block and is
  raised in the caller with the block's rows, columns and device. Ctrl-C stops every worker and waits for
  them (each finishes the block in hand; no thread or stream is left running) before the KeyboardInterrupt
  goes on. Writers write only the cells of the blocks they are given.
"""

from __future__ import annotations

import contextlib
import math
import os
import signal
import sys
import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import torch

from ..devices import cpu_workers, resolve_devices
from .scheduler import Block, BlockGrid, plan_blocks

__all__ = [
    "BlockError",
    "BlockPolicy",
    "BlockWriter",
    "Progress",
    "RunStats",
    "cpu_workers",
    "home_devices",
    "last_run",
    "resolve_devices",
    "run_blocks",
]

CPU_BUDGET_BYTES = 1 << 30  # a CPU worker's default budget (blocks of at most 256 MiB of output)


class BlockPolicy(Protocol):
    """What an operation tells the engine (policies.py): the output's size and dtype, the operand bytes a
    block needs per output row / column, and how to compute one block on a device."""

    m: int
    n: int
    value_dim: int  # D: the output is (m, n) when 1 and not ``keep_value_dim``, else (m, n, D)
    dtype: torch.dtype
    operand_row_bytes: int
    operand_col_bytes: int

    def prepare(self, device: torch.device) -> Any:
        """Per-device state made once by the device's worker (e.g. operands uploaded whole)."""

    def compute(self, state: Any, block: Block, device: torch.device) -> torch.Tensor:
        """The block's values, (rows, cols[, D]) on ``device``, in ``dtype``."""


class BlockWriter(Protocol):
    """Where a computed block goes (writers.py): the cells of ``block`` from a host tensor (rows, cols[, D])."""

    def write(self, block: Block, values: torch.Tensor) -> None: ...


class BlockError(RuntimeError):
    """An exception raised while a block was computed or written, with the block's place."""

    def __init__(self, block: Block, device: torch.device, cause: BaseException) -> None:
        super().__init__(
            f"block rows [{block.r0}, {block.r1}) x columns [{block.c0}, {block.c1}) on {device}: "
            f"{type(cause).__name__}: {cause}"
        )
        self.block, self.device = block, device


def home_devices(device: torch.device) -> list[torch.device]:
    """The workers for data on ``device`` when the caller names none: that GPU, or the CPU workers."""
    return [device] if device.type == "cuda" else cpu_workers()


def plan_for(
    policy: BlockPolicy,
    devices: Sequence[torch.device],
    max_device_bytes: int | None,
    triangle: str | None = None,
    diagonal: bool = False,
) -> BlockGrid:
    """The plan of ``policy``'s output for ``devices``: the smallest free memory and SM count among them (a
    CPU worker: CPU_BUDGET_BYTES and the core count); on GPUs, bands of whole rows when they fit (rule 7:
    one contiguous download and host write per block)."""
    free, sms = [], []
    for dev in devices:
        if dev.type == "cuda":
            free.append(torch.cuda.mem_get_info(dev)[0])
            sms.append(torch.cuda.get_device_properties(dev).multi_processor_count)
        else:
            free.append(CPU_BUDGET_BYTES * 5 // 4)  # 0.8 x this is the CPU budget
            sms.append(os.cpu_count() or 1)
    return plan_blocks(
        policy.m,
        policy.n,
        value_dim=policy.value_dim,
        elem_bytes=torch.empty((), dtype=policy.dtype).element_size(),
        free_bytes=min(free),
        max_device_bytes=max_device_bytes,
        sm_count=min(sms),
        n_gpus=len(devices),
        rows_per_sm=1 if devices[0].type == "cpu" else 8,
        operand_row_bytes=policy.operand_row_bytes,
        operand_col_bytes=policy.operand_col_bytes,
        triangle=triangle,  # type: ignore[arg-type]
        diagonal=diagonal,
        full_rows=devices[0].type == "cuda",
    )


class Progress:
    """Blocks done, GB written and the rate: a tqdm bar when tqdm is installed, else one text line on stderr
    redrawn at most twice a second; nothing when ``enabled`` is False."""

    def __init__(self, total_blocks: int, enabled: bool) -> None:
        self.total, self.enabled, self.done, self.bytes = total_blocks, enabled, 0, 0
        self.start = self._last = time.perf_counter()
        self._lock = threading.Lock()
        self._bar = None
        if enabled:
            try:
                from tqdm.auto import tqdm

                self._bar = tqdm(total=total_blocks, unit="block", desc="semiring_ops.blocks")
            except ImportError:
                self._bar = None

    def update(self, nbytes: int) -> None:
        with self._lock:
            self.done += 1
            self.bytes += nbytes
            if not self.enabled:
                return
            elapsed = max(time.perf_counter() - self.start, 1e-9)
            rate = self.bytes / elapsed / 1e9
            if self._bar is not None:
                self._bar.set_postfix_str(f"{self.bytes / 1e9:.2f} GB, {rate:.2f} GB/s", refresh=False)
                self._bar.update(1)
            elif self.done == self.total or time.perf_counter() - self._last > 0.5:
                self._last = time.perf_counter()
                end = "\n" if self.done == self.total else ""
                print(
                    f"\rsemiring_ops.blocks: {self.done}/{self.total} blocks, {self.bytes / 1e9:.2f} GB written, "
                    f"{rate:.2f} GB/s",
                    end=end,
                    file=sys.stderr,
                    flush=True,
                )

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()


@dataclass
class RunStats:
    """Where one run_blocks call spent its time (``blocks.last_run()``): ``blocks`` written, output ``bytes``,
    wall-clock ``seconds``; summed over the workers: ``write_seconds`` in the writer (the host copy into the
    output, first touch of its pages included) and ``wait_seconds`` waiting for a block's device-to-host copy
    (a GPU worker). A pipeline bound by the host write has write_seconds close to seconds x workers."""

    blocks: int = 0
    bytes: int = 0
    seconds: float = 0.0
    write_seconds: float = 0.0
    wait_seconds: float = 0.0
    devices: tuple[str, ...] = ()
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def add(self, write: float = 0.0, wait: float = 0.0) -> None:
        with self._lock:
            self.write_seconds += write
            self.wait_seconds += wait

    @property
    def write_gb_per_s(self) -> float:
        """Output GB per second of writer time, per worker: the host write's own rate."""
        return self.bytes / 1e9 / self.write_seconds if self.write_seconds else float("nan")


_last_run = RunStats()


def last_run() -> RunStats:
    """The statistics of the last block engine run in this process (any thread)."""
    return _last_run


def _halves(block: Block) -> list[Block]:
    """A block cut in two along its longer side (for a retry after running out of memory)."""
    if block.rows >= block.cols and block.rows > 1:
        mid = block.r0 + block.rows // 2
        return [replace(block, r1=mid), replace(block, r0=mid)]
    if block.cols > 1:
        mid = block.c0 + block.cols // 2
        return [replace(block, c1=mid), replace(block, c0=mid)]
    raise torch.cuda.OutOfMemoryError(f"a 1 x 1 block at ({block.r0}, {block.c0}) does not fit the device")


class _Shared:
    """The queue of blocks, the stop flag and the first error, shared by the workers."""

    def __init__(self, blocks: Sequence[Block]) -> None:
        self.queue: deque[Block] = deque(blocks)
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.error: BaseException | None = None

    def take(self) -> Block | None:
        with self.lock:
            return None if self.stop.is_set() or not self.queue else self.queue.popleft()

    def fail(self, exc: BaseException) -> None:
        with self.lock:
            if self.error is None:
                self.error = exc
        self.stop.set()


def _is_oom(exc: BaseException) -> bool:
    return isinstance(exc, torch.cuda.OutOfMemoryError) or "out of memory" in str(exc)


def _compute_fitting(policy: BlockPolicy, state: Any, block: Block, device: torch.device) -> list:
    """[(piece, values)] for ``block``: computed whole, or in halves (recursively) when the device runs out of
    memory."""
    try:
        return [(block, policy.compute(state, block, device))]
    except Exception as exc:
        if device.type != "cuda" or not _is_oom(exc):
            raise
    torch.cuda.empty_cache()
    return [pair for half in _halves(block) for pair in _compute_fitting(policy, state, half, device)]


def _cpu_worker(policy, writer, device, shared: _Shared, progress: Progress, stats: RunStats) -> None:
    state = policy.prepare(device)
    while (block := shared.take()) is not None:
        try:
            values = policy.compute(state, block, device)
            t0 = time.perf_counter()
            writer.write(block, values)
            stats.add(write=time.perf_counter() - t0)
            progress.update(values.numel() * values.element_size())
        except BaseException as exc:
            shared.fail(BlockError(block, device, exc))
            return


STAGING_CHUNK_BYTES = 256 << 20  # a GPU worker's downloads and host writes: row ranges of at most this
STAGING_SLOTS = 4  # pinned chunks per GPU worker: copies in flight while the host writes the oldest


class _Slot:
    """One pinned staging chunk of a GPU worker's ring, the event of its last copy and what that copy brought."""

    def __init__(self) -> None:
        self.staging: torch.Tensor | None = None
        self.event = torch.cuda.Event()
        self.pending: list[tuple[Block, torch.Tensor]] = []  # (piece, staging view) copied, not yet written

    def view(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        numel = math.prod(shape)
        if self.staging is None or self.staging.numel() < numel or self.staging.dtype != dtype:
            self.staging = torch.empty(max(numel, 1), dtype=dtype, pin_memory=True)
        return self.staging[:numel].view(shape)


def _row_chunks(piece: Block, values: torch.Tensor, chunk_bytes: int) -> list[tuple[Block, torch.Tensor]]:
    """``piece`` and its values cut into row ranges of at most ``chunk_bytes`` (at least one row each)."""
    row_bytes = values[0].numel() * values.element_size() if piece.rows else 0
    step = max(1, chunk_bytes // max(row_bytes, 1))
    if step >= piece.rows:
        return [(piece, values)]
    return [
        (replace(piece, r0=piece.r0 + i, r1=min(piece.r1, piece.r0 + i + step)), values[i : i + step])
        for i in range(0, piece.rows, step)
    ]


def _gpu_worker(policy, writer, device, shared: _Shared, progress: Progress, stats: RunStats) -> None:
    block: Block | None = None
    try:
        with torch.cuda.device(device):
            compute, copy = torch.cuda.Stream(device), torch.cuda.Stream(device)
            with torch.cuda.stream(compute):
                state = policy.prepare(device)
            ring, k = [_Slot() for _ in range(STAGING_SLOTS)], 0

            def drain(slot: _Slot) -> None:  # the host writes what the slot's last copy brought
                t0 = time.perf_counter()
                slot.event.synchronize()
                t1 = time.perf_counter()
                for piece, host in slot.pending:
                    writer.write(piece, host)
                    progress.update(host.numel() * host.element_size())
                stats.add(write=time.perf_counter() - t1, wait=t1 - t0)
                slot.pending = []

            while (block := shared.take()) is not None:
                with torch.cuda.stream(compute):
                    pieces = _compute_fitting(policy, state, block, device)
                copy.wait_stream(compute)  # block k's copies start when it is computed; block k + 1 computes meanwhile
                for piece, values in pieces:
                    for part, chunk in _row_chunks(piece, values, STAGING_CHUNK_BYTES):
                        slot = ring[k % STAGING_SLOTS]
                        drain(slot)  # the oldest copy is written by the host before its memory is reused
                        host = slot.view(tuple(chunk.shape), policy.dtype)
                        with torch.cuda.stream(copy):
                            host.copy_(chunk, non_blocking=True)
                            slot.event.record(copy)
                        slot.pending.append((part, host))
                        k += 1
                    values.record_stream(copy)
            block = None
            for i in range(STAGING_SLOTS):  # the last copies, oldest first
                drain(ring[(k + i) % STAGING_SLOTS])
    except BaseException as exc:
        shared.fail(BlockError(block, device, exc) if block is not None else exc)
    finally:
        with contextlib.suppress(RuntimeError):  # a broken context: the error already recorded says why
            torch.cuda.synchronize(device)  # nothing left running on the worker's streams


_HOLDS_SIGNALS = hasattr(signal, "pthread_sigmask")


@contextlib.contextmanager
def _sigint_held():
    """SIGINT blocked in this thread for the block (POSIX): a Ctrl-C meanwhile stays pending and is delivered, as
    KeyboardInterrupt in the main thread, when the block ends. Threads started inside inherit the mask."""
    if not _HOLDS_SIGNALS:
        yield
        return
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def _release_sigint() -> None:
    """A worker started under _sigint_held unblocks SIGINT again, so that what it runs (a compiler, a subprocess)
    inherits no blocked Ctrl-C."""
    if _HOLDS_SIGNALS:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def run_blocks(
    policy: BlockPolicy,
    writer: BlockWriter,
    grid: BlockGrid,
    devices: Sequence[torch.device],
    progress: bool | None = None,
) -> RunStats:
    """Computes every block of ``grid`` with ``policy`` on ``devices`` (one worker thread each) and hands it
    to ``writer``. ``progress``: None shows progress when stderr is a terminal and there are several blocks.
    Returns the run's RunStats (also ``last_run()``). Raises BlockError (the first failure, from any worker)
    after every worker has stopped; Ctrl-C stops them all, then goes on."""
    global _last_run
    stats = _last_run = RunStats(devices=tuple(str(d) for d in devices))
    if not grid.blocks:
        return stats
    start = time.perf_counter()
    shown = progress if progress is not None else (len(grid.blocks) > 1 and sys.stderr.isatty())
    bar = Progress(len(grid.blocks), shown)
    shared = _Shared(grid.blocks)

    # Every worker keeps SIGINT held (inherited from the starting thread: _sigint_held) until all are started and
    # on the books: a signal the kernel delivered to a running worker would otherwise raise KeyboardInterrupt in
    # the main thread between a start and its bookkeeping, whatever the main thread's own mask (Python runs its
    # handlers in the main thread for a signal any thread received), leaving a started worker unwaited for.
    all_started = threading.Event()

    def work(dev: torch.device, finished: threading.Event) -> None:
        try:
            all_started.wait()
            _release_sigint()
            (_gpu_worker if dev.type == "cuda" else _cpu_worker)(policy, writer, dev, shared, bar, stats)
        finally:
            finished.set()

    started: list[tuple[threading.Thread, threading.Event]] = []

    def wait_all() -> None:  # timed waits on events, so that Ctrl-C reaches this thread (a join it cuts short
        for _, ev in started:  # may return with the thread still running: the events say when a worker is done)
            while not ev.wait(0.1):
                pass
        for w, _ in started:
            w.join()

    try:
        # Ctrl-C held while the workers start: one landing between a start and its bookkeeping would leave a
        # started worker unwaited for, or a never-started one waited for forever (the interrupt then arrives
        # when the mask is restored, below in this try)
        try:
            with _sigint_held():
                for dev in devices:
                    ev = threading.Event()
                    w = threading.Thread(target=work, args=(dev, ev), name=f"semiring_ops.blocks {dev}", daemon=True)
                    w.start()
                    started.append((w, ev))
        finally:
            all_started.set()
        wait_all()
    except KeyboardInterrupt:
        shared.stop.set()
        wait_all()
        raise
    finally:
        bar.close()
        stats.blocks, stats.bytes, stats.seconds = bar.done, bar.bytes, time.perf_counter() - start
    if shared.error is not None:
        raise shared.error
    return stats
