"""HMM emission models: the interface (base.py) and one file per family."""

from .base import ArrayLike, Emission, dirichlet_map
from .categorical import CategoricalEmission
from .gaussian import (
    COVARIANCE_TYPES,
    GaussianDiagEmission,
    GaussianEmission,
    GaussianFullEmission,
    GaussianSphericalEmission,
    GaussianTiedEmission,
    gaussian_emission,
    validate_covars,
)
from .gmm import GMMEmission
from .multinomial import MultinomialEmission
from .poisson import PoissonEmission

__all__ = [
    "COVARIANCE_TYPES",
    "ArrayLike",
    "CategoricalEmission",
    "Emission",
    "GMMEmission",
    "GaussianDiagEmission",
    "GaussianEmission",
    "GaussianFullEmission",
    "GaussianSphericalEmission",
    "GaussianTiedEmission",
    "MultinomialEmission",
    "PoissonEmission",
    "dirichlet_map",
    "gaussian_emission",
    "validate_covars",
]
