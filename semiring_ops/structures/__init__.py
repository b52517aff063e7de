"""Structured prediction, written once and generic over the semiring (the chain engine first)."""

from .alignment import Alignment
from .base import Structure
from .chain import chain_sum, chain_viterbi
from .cky import CKYTree
from .constraints import Constraints, allowed_transitions
from .crf import LinearChainCRF
from .ctc import CTC
from .dependency import DependencyTree
from .factored import chain_sum_factored, chain_viterbi_factored
from .linear_chain import LinearChain
from .nonprojective import NonProjectiveDependencyTree
from .rnnt import RNNT
from .semimarkov import SemiMarkov

__all__ = [
    "CTC",
    "RNNT",
    "Alignment",
    "CKYTree",
    "Constraints",
    "DependencyTree",
    "LinearChain",
    "LinearChainCRF",
    "NonProjectiveDependencyTree",
    "SemiMarkov",
    "Structure",
    "allowed_transitions",
    "chain_sum",
    "chain_sum_factored",
    "chain_viterbi",
    "chain_viterbi_factored",
]
