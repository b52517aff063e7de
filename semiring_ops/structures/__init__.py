"""Structured prediction, written once and generic over the semiring (the chain engine first)."""

from .chain import chain_sum, chain_viterbi
from .constraints import Constraints, allowed_transitions
from .crf import LinearChainCRF
from .factored import chain_sum_factored, chain_viterbi_factored
from .hmm import HMM

__all__ = [
    "HMM",
    "Constraints",
    "LinearChainCRF",
    "allowed_transitions",
    "chain_sum",
    "chain_sum_factored",
    "chain_viterbi",
    "chain_viterbi_factored",
]
