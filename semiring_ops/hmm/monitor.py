"""EM's bookkeeping: hmmlearn's ConvergenceMonitor and the progress bar of a verbose fit."""

from __future__ import annotations

import logging
import math
import sys
from typing import TextIO

import numpy as np

__all__ = ["ConvergenceMonitor"]

_log = logging.getLogger("semiring_ops.hmm")


class ConvergenceMonitor:
    """hmmlearn's ConvergenceMonitor: EM's log-likelihood history and stopping rule.

    ``history`` lists the log-likelihood of the data before each M-step (so it must not decrease),
    ``iter`` counts iterations; ``converged`` is true after n_iter iterations or once an iteration
    gains less than ``tol``.
    """

    _template = "{iter:>10d} {log_prob:>16.8f} {delta:>+16.8f} {seconds:>9.3f}s"

    def __init__(self, tol: float, n_iter: int, verbose: bool = False) -> None:
        self.tol, self.n_iter, self.verbose = tol, n_iter, verbose
        self.history: list[float] = []
        self.iter = 0

    def __repr__(self) -> str:
        return f"ConvergenceMonitor(tol={self.tol}, n_iter={self.n_iter}, iter={self.iter}, history={self.history})"

    def _reset(self) -> None:
        """Forget the history (hmmlearn's fit calls this before EM)."""
        self.iter = 0
        self.history.clear()

    def report(self, log_prob: float, seconds: float = 0.0) -> str:
        """Record one iteration's log-likelihood; returns hmmlearn's per-iteration line (plus seconds)."""
        delta = log_prob - self.history[-1] if self.history else math.nan
        if self.history and delta < -math.sqrt(np.finfo(float).eps) * max(1.0, abs(log_prob)):
            _log.warning(f"EM is not converging: log-likelihood {log_prob} < {self.history[-1]} (delta {delta})")
        self.history.append(log_prob)
        self.iter += 1
        return self._template.format(iter=self.iter, log_prob=log_prob, delta=delta, seconds=seconds)

    @property
    def converged(self) -> bool:
        return self.iter == self.n_iter or (len(self.history) >= 2 and self.history[-1] - self.history[-2] < self.tol)


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
