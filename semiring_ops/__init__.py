"""semiring_ops: semiring batched matmul and structured prediction for PyTorch.

import semiring_ops as so
c = so.logbmm(a, b)                       # logsumexp_k a[..., i, k] + b[..., k, j]
v, idx = so.maxbmm(a, b, return_argmax=True)
so.semiring_matmul(a, b, so.MinSemiring)
crf = so.LinearChainCRF(num_tags, batch_first=True)   # pytorch-crf's interface, fused chain kernels
hmm = so.HMM(n_states, n_symbols=V)                   # hmmlearn's interface
so.einsum("ai,ij,jk->ak", x, W1, W2, semiring="max")  # any contraction, planned, on the fused kernels
"""

__version__ = "0.1.0"

from .alignment import CTCLoss, RNNTLoss, TokenSpan, ctc_loss, ctc_posteriors, forced_align, merge_tokens, rnnt_loss
from .einsum import einsum
from .hmm import HMM
from .info import backend_info
from .nn import SemiringLinear
from .ops import logbmm, maxbmm, minbmm, semiring_matmul, stdbmm
from .semirings import LogSemiring, MaxSemiring, MinSemiring, Semiring, StdSemiring
from .structures import LinearChainCRF, allowed_transitions

__all__ = [
    "HMM",
    "CTCLoss",
    "LinearChainCRF",
    "LogSemiring",
    "MaxSemiring",
    "MinSemiring",
    "RNNTLoss",
    "Semiring",
    "SemiringLinear",
    "StdSemiring",
    "TokenSpan",
    "__version__",
    "allowed_transitions",
    "backend_info",
    "ctc_loss",
    "ctc_posteriors",
    "einsum",
    "forced_align",
    "logbmm",
    "maxbmm",
    "merge_tokens",
    "minbmm",
    "rnnt_loss",
    "semiring_matmul",
    "stdbmm",
]
