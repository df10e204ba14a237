"""A scikit-learn front door: random-feature transformers and linear models.

``RandomFeatures`` is a drop-in transformer for ``sklearn.kernel_approximation.RBFSampler``
(``rfjax.sklearn._random_features``); ``RandomFeatureRidge`` and
``RandomFeatureRidgeClassifier`` fit ridge regression and classification on its features in one
streaming pass (``rfjax.sklearn._ridge``, on ``rfjax.linear_models``).

Example:
  >>> from sklearn.pipeline import make_pipeline
  >>> from sklearn.linear_model import RidgeClassifier
  >>> from rfjax.sklearn import RandomFeatures
  >>> model = make_pipeline(RandomFeatures(gamma=0.01, random_state=0), RidgeClassifier())
"""

from rfjax.sklearn._random_features import KERNELS, RandomFeatures, feature_names
from rfjax.sklearn._ridge import RandomFeatureRidge, RandomFeatureRidgeClassifier

__all__ = [
    "KERNELS",
    "RandomFeatureRidge",
    "RandomFeatureRidgeClassifier",
    "RandomFeatures",
    "feature_names",
]
