"""rfjax: random-feature kernel approximation in JAX.

Layers (lower never import higher): ``ops`` (the FWHT) -> ``projections`` (couplings) ->
``features`` (feature maps) -> estimates (``attention``: FAVOR linear attention;
``sampled_softmax``: sampled softmax with random-feature proposals; ``linear_models``: ridge on
random features); ``kernels`` (exact oracles) and ``theory`` (closed-form errors) beside them;
``nn`` (Flax modules) and ``sklearn`` (scikit-learn estimators) on top; ``data`` (loaders).

Every subpackage is imported on first use (``rfjax.nn`` imports Flax, ``rfjax.sklearn``
scikit-learn), so ``import rfjax`` costs nothing beyond what is used.
"""

import importlib
import typing

__version__ = "0.1.0"

_SUBPACKAGES = (
    "attention",
    "data",
    "features",
    "kernels",
    "linear_models",
    "nn",
    "ops",
    "projections",
    "sampled_softmax",
    "sklearn",
    "theory",
)

__all__ = [
    "__version__",
    "attention",
    "data",
    "features",
    "kernels",
    "linear_models",
    "nn",
    "projections",
    "sampled_softmax",
    "theory",
]

if typing.TYPE_CHECKING:  # what the lazy attributes are, for type checkers
    from rfjax import (  # noqa: F401 (ops and sklearn: public, outside __all__)
        attention,
        data,
        features,
        kernels,
        linear_models,
        nn,
        ops,
        projections,
        sampled_softmax,
        sklearn,
        theory,
    )


def __getattr__(name: str) -> typing.Any:
    """``rfjax.<subpackage>``, imported on first access (PEP 562)."""
    if name in _SUBPACKAGES:
        return importlib.import_module(f"rfjax.{name}")
    raise AttributeError(f"module 'rfjax' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_SUBPACKAGES})
