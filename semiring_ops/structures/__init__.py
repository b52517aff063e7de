"""Structured prediction, written once and generic over the semiring (the chain engine first)."""

from .chain import chain_sum, chain_viterbi
from .crf import LinearChainCRF

__all__ = ["LinearChainCRF", "chain_sum", "chain_viterbi"]
