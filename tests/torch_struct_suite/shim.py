"""The names torch-struct 0.5's test files import from ``torch_struct``, served by semiring_ops: the runner
(tests/test_torch_struct_suite.py) rewrites their ``from torch_struct import ...`` lines to import from here.

- ``LinearChainCRF``: semiring_ops.distributions.LinearChainCRF plus torch-struct's ``struct`` class attribute
  (torch_struct.LinearChain), which the tests read for two things only: ``struct._rand()`` (their random
  potentials) and the key of their brute-force enumerator (extensions.py's ``test_lookup``). Every member they
  measure (log_prob, entropy, cross_entropy, kl, argmax, marginals, sample, kmax, count) is semiring_ops'.
- ``KMaxSemiring``, ``LogSemiring``, ``MaxSemiring``, ``StdSemiring``: semiring_ops'.
- ``TorchStructLogSemiring``: torch-struct's LogSemiring, which test_distributions.py only hands to that
  enumerator (torch-struct's reference code, extensions.py, which imports torch_struct itself).
- ``Autoregressive``, ``CheckpointSemiring``, ``CheckpointShardSemiring``: not in semiring_ops; they raise
  NotImplementedError.
"""

from __future__ import annotations

import torch_struct

from semiring_ops import distributions
from semiring_ops.semirings import LogSemiring, MaxSemiring, StdSemiring
from semiring_ops.structure_semirings import KMaxSemiring

__all__ = [
    "Autoregressive",
    "CheckpointSemiring",
    "CheckpointShardSemiring",
    "KMaxSemiring",
    "LinearChainCRF",
    "LogSemiring",
    "MaxSemiring",
    "StdSemiring",
    "TorchStructLogSemiring",
]

TorchStructLogSemiring = torch_struct.LogSemiring


class LinearChainCRF(distributions.LinearChainCRF):
    """semiring_ops' LinearChainCRF; ``struct``: torch-struct's structure class, the tests' reference side."""

    struct = torch_struct.LinearChain


def _missing(name: str, what: str):
    def missing(*args, **kwargs):
        raise NotImplementedError(f"semiring_ops has no {name} ({what})")

    missing.__name__ = name
    return missing


Autoregressive = _missing("Autoregressive", "torch-struct's autoregressive model distribution and beam search")
CheckpointSemiring = _missing("CheckpointSemiring", "torch-struct's gradient-checkpointing semiring wrapper")
CheckpointShardSemiring = _missing("CheckpointShardSemiring", "torch-struct's sharded checkpointing wrapper")
