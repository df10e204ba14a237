"""The estimator zoo's input pairs: groups of queries and keys ``(G, T, d)``.

Three sources, each a ``PairSet``:

* ``synthetic``: one group per norm r; in it, for every cosine c, the pair x = r R e_1,
  y = r R (c e_1 + sqrt(1 - c^2) e_2) with its own random rotation R. Pairs are read in place
  (query t with key t).
* ``vit``: the per-head queries and keys of a trained Performer-ViT on test images
  (``experiments.estimator_zoo_vit``), one group per (image, layer, head), times H^{-1/4} each
  so that q.k is the model's softmax logit q k^T / sqrt(H). Every query meets every key of its
  group (the attention matrix).
* ``uci:<name>``: groups of ``group_size`` queries and ``group_size`` keys, all distinct rows
  of a UCI set, standardised (mean 0, sd 1 per column over the whole set) and divided by the
  Gaussian kernel's lengthscale by the median heuristic (the median query-key distance), so
  that the median |q - k| is 1; every query meets every key of its group. (The SimRF paper's
  bandwidths, ``rfjax.data.UCI_BANDWIDTHS``, give |x|^2 up to ~7 on average and 4 x.y up to
  ~100 on some pairs: the Gaussian kernel's FAVOR+ second moment is exp(4 x.y), far beyond what
  a few hundred draws can estimate.)
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from rfjax import data


class PairSet(NamedTuple):
    """Queries and keys ``(G, T, d)``; ``paired``: query t meets key t only (else all keys)."""

    name: str
    queries: np.ndarray
    keys: np.ndarray
    paired: bool


def synthetic(key: jax.Array, dim: int, norms, cosines) -> PairSet:
    """The grid pairs: one group per norm, one pair per cosine."""
    queries = np.zeros((len(norms), len(cosines), dim))
    keys = np.zeros_like(queries)
    for index, (g, t) in enumerate((g, t) for g in range(len(norms)) for t in range(len(cosines))):
        q, _ = jnp.linalg.qr(jax.random.normal(jax.random.fold_in(key, index), (dim, dim)))
        rotation = np.asarray(q, np.float64)
        norm, cosine = norms[g], cosines[t]
        queries[g, t] = norm * rotation[:, 0]
        keys[g, t] = norm * (cosine * rotation[:, 0] + math.sqrt(1.0 - cosine**2) * rotation[:, 1])
    return PairSet("synthetic", queries, keys, True)


def vit(path: str) -> PairSet:
    """The saved ViT queries and keys ``(images, layers, T, heads, H)`` as groups ``(G, T, H)``."""
    with np.load(path) as saved:
        queries, keys = saved["queries"], saved["keys"]
    head_dim = queries.shape[-1]

    def groups(array):
        # (images, layers, T, heads, H) -> (images * layers * heads, T, H)
        moved = np.moveaxis(array, 3, 2)
        return moved.reshape(-1, array.shape[2], head_dim).astype(np.float64) * head_dim**-0.25

    return PairSet("vit", groups(queries), groups(keys), False)


def uci(name: str, num_groups: int, group_size: int, seed: int) -> PairSet:
    """``num_groups`` groups of ``group_size`` queries and as many keys, distinct rows of UCI set
    ``name``, standardised and divided by the median query-key distance."""
    inputs, _ = data.load_uci(name)
    needed = 2 * num_groups * group_size
    if needed > len(inputs):
        raise ValueError(
            f"2 * uci_groups * uci_group_size must be <= the rows of {name} ({len(inputs)}), "
            f"got 2 * {num_groups} * {group_size}"
        )
    std = inputs.std(axis=0)
    standardised = (inputs - inputs.mean(axis=0)) / np.where(std > 0, std, 1.0)
    rows = np.random.default_rng(seed).choice(len(inputs), needed, replace=False)
    groups = standardised[rows].reshape(num_groups, 2, group_size, -1)
    queries, keys = groups[:, 0], groups[:, 1]
    distances = np.linalg.norm(queries[:, :, None] - keys[:, None], axis=-1)
    lengthscale = float(np.median(distances))
    return PairSet(f"uci:{name}", queries / lengthscale, keys / lengthscale, False)
