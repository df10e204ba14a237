"""rfjax: random-feature kernel approximation in JAX.

Layers (lower never import higher): ``projections`` (couplings) -> ``features`` (feature maps)
-> estimates; ``kernels`` (exact oracles) and ``theory`` (closed-form errors) beside them.
"""

from rfjax import features, kernels, projections, theory

__version__ = "0.1.0"

__all__ = ["__version__", "features", "kernels", "projections", "theory"]
