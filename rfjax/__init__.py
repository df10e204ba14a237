"""rfjax: random-feature kernel approximation in JAX.

Layers (lower never import higher): ``projections`` (couplings) -> ``features`` (feature maps)
-> estimates (``attention``: FAVOR linear attention; ``linear_models``: ridge on random
features); ``kernels`` (exact oracles) and
``theory`` (closed-form errors) beside them; ``nn`` (Flax modules) on top; ``data`` (loaders).
"""

from rfjax import attention, data, features, kernels, linear_models, nn, projections, theory

__version__ = "0.1.0"

__all__ = [
    "__version__",
    "attention",
    "data",
    "features",
    "kernels",
    "linear_models",
    "nn",
    "projections",
    "theory",
]
