"""Structured prediction, written once and generic over the semiring (the chain engine first)."""

from .chain import chain_sum, chain_viterbi

__all__ = ["chain_sum", "chain_viterbi"]
