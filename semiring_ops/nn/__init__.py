"""nn.Module layers built on the semiring operators, and layers that score structures for the distributions."""

from .biaffine import BiaffineArcScorer, BiaffineScores
from .linear import SemiringLinear
from .segmenter import SemiMarkovSegmenter

__all__ = ["BiaffineArcScorer", "BiaffineScores", "SemiMarkovSegmenter", "SemiringLinear"]
