"""nn.Module layers built on the semiring operators."""

from .linear import SemiringLinear

__all__ = ["SemiringLinear"]
