"""Alignment losses on the semiring engine: CTC (torch's ctc_loss interface, any of log / max), its label
posteriors, forced alignment (torchaudio's interface, batched) and its token spans, and the RNN-T loss
(torchaudio's interface, log or max) on the RNN-T lattice structure."""

from .ctc import CTCLoss, ctc_loss, ctc_posteriors
from .forced_align import forced_align
from .rnnt import RNNTLoss, rnnt_loss
from .token_spans import TokenSpan, merge_tokens

__all__ = [
    "CTCLoss",
    "RNNTLoss",
    "TokenSpan",
    "ctc_loss",
    "ctc_posteriors",
    "forced_align",
    "merge_tokens",
    "rnnt_loss",
]
