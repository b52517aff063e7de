"""EM's bookkeeping: hmmlearn's ConvergenceMonitor and the progress bar of a verbose fit."""

from __future__ import annotations

import contextlib
import io
import logging
import math
import sys
from collections import deque
from collections.abc import Iterator
from typing import TextIO

import numpy as np

__all__ = ["ConvergenceMonitor"]

_log = logging.getLogger("semiring_ops.hmm")


class ConvergenceMonitor:
    """hmmlearn's ConvergenceMonitor: EM's log-likelihood history and stopping rule, with hmmlearn's attributes
    and behaviour (subclass it and override ``converged`` for another rule, then set a model's ``monitor_``).

    ``history`` (a deque, unbounded as hmmlearn's) holds the log-likelihood reported by each iteration (the data's
    before that iteration's M-step, so it must not decrease); ``iter`` counts the reports. ``report`` writes
    ``_template`` (iteration, log-likelihood, gain over the previous one; NaN at the first) to ``sys.stderr`` when
    ``verbose`` and logs a warning when the log-likelihood drops by more than sqrt(machine epsilon).
    ``converged``: ``n_iter`` reports made, or the last one gained less than ``tol``.
    """

    _template = "{iter:>10d} {log_prob:>16.8f} {delta:>+16.8f}"

    def __init__(self, tol: float, n_iter: int, verbose: bool = False) -> None:
        self.tol, self.n_iter, self.verbose = tol, n_iter, verbose
        self.history: deque[float] = deque()
        self.iter = 0

    def __repr__(self) -> str:
        fields = sorted({**vars(self), "history": list(self.history)}.items())
        return f"{type(self).__name__}(\n" + "".join(f"    {name}={value},\n" for name, value in fields) + ")"

    def _reset(self) -> None:
        """Forget the history and the iteration count (a model's fit calls this before EM)."""
        self.iter = 0
        self.history.clear()

    def report(self, log_prob: float) -> None:
        """Record one EM iteration's log-likelihood (printing its line to stderr when verbose)."""
        previous = self.history[-1] if self.history else None
        delta = log_prob - previous if previous is not None else np.nan
        if self.verbose:
            print(self._template.format(iter=self.iter + 1, log_prob=log_prob, delta=delta), file=sys.stderr)
        if previous is not None and delta < -math.sqrt(np.finfo(float).eps):
            _log.warning(f"EM is not converging: log-likelihood {log_prob} fell below {previous} by {-delta}")
        self.history.append(log_prob)
        self.iter += 1

    @property
    def converged(self) -> bool:
        """Whether EM should stop: n_iter iterations done, or the last one gained less than tol."""
        return self.iter == self.n_iter or (len(self.history) >= 2 and self.history[-1] - self.history[-2] < self.tol)


class _LinesAbove(io.TextIOBase):
    """A text stream that prints each complete line above a progress bar (stderr while a bar is drawn)."""

    def __init__(self, bar: _ProgressBar) -> None:
        super().__init__()
        self.bar, self.pending = bar, ""

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        *lines, self.pending = (self.pending + text).split("\n")
        for line in lines:
            self.bar.write(line)
        return len(text)


class _ProgressBar:
    """EM progress on a stream (stderr): on a terminal a bar redrawn in place, with lines printed above
    it; elsewhere (a file, a pipe) a plain line at every tenth of the iterations and at the end."""

    def __init__(self, total: int, stream: TextIO | None = None, width: int = 30) -> None:
        self.total, self.stream, self.width = max(total, 1), stream or sys.stderr, width
        self.live = bool(getattr(self.stream, "isatty", lambda: False)())
        self.shown = ""  # the bar as last drawn on the terminal
        self.tenth = -1  # the last tenth reported off the terminal

    def update(self, done: int, log_prob: float, final: bool = False) -> None:
        filled = self.width * done // self.total
        text = f"EM [{'#' * filled}{'.' * (self.width - filled)}] {done}/{self.total}  log-likelihood {log_prob:.6f}"
        if self.live:
            self._draw(text)
        elif final or 10 * done // self.total > self.tenth:
            self.tenth = 10 * done // self.total
            self.stream.write(text + "\n")

    @contextlib.contextmanager
    def above(self) -> Iterator[None]:
        """Within: what is printed to ``sys.stderr`` (the monitor's verbose lines) goes above the bar."""
        with contextlib.redirect_stderr(_LinesAbove(self)):
            yield

    def write(self, line: str) -> None:
        shown = self.shown
        if shown:
            self._draw("")
            self.stream.write("\r")
        self.stream.write(line + "\n")
        if shown:
            self._draw(shown)

    def close(self) -> None:
        if self.shown:
            self.stream.write("\n")
        self.stream.flush()

    def _draw(self, text: str) -> None:
        self.stream.write("\r" + text.ljust(len(self.shown)))
        self.stream.flush()
        self.shown = text
