"""Alignment losses on the semiring engine: CTC (torch's interface) first; forced alignment and RNN-T to come
(issue 43)."""

from .ctc import CTCLoss, ctc_loss

__all__ = ["CTCLoss", "ctc_loss"]
