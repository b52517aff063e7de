"""Alignment losses on the semiring engine: CTC (torch's ctc_loss interface, any of log / max), its label
posteriors, and forced alignment (torchaudio's interface, batched); RNN-T to come (issue 43)."""

from .ctc import CTCLoss, ctc_loss, ctc_posteriors
from .forced_align import forced_align

__all__ = ["CTCLoss", "ctc_loss", "ctc_posteriors", "forced_align"]
