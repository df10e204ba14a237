"""The SimRF Fig. 8 classifier (SimRF Sec. 5.3, App. B.1-B.2), shared by the UCI study
(``experiments.uci_classification``) and its benchmark (``benchmarks.uci_protocol``).

A test point x gets the class argmax_c sum_{j: y_j = c} K_hat(x, x_j) with
K_hat(x, x_j) = phi(x) . phi(x_j) and Gaussian-kernel positive random features phi
(K = exp(-|x - y|^2 / 2)); by linearity the sum is phi(x) . S_c with S_c = sum_{j in c} phi(x_j),
so one draw costs O(N m d). ``split_and_scale`` is the authors' split and scaling (``SPLITS``:
see ``experiments.uci_classification``).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from rfjax import features, projections

SPLITS = ("all_rows", "authors")


def split_and_scale(
    x: np.ndarray,
    y: np.ndarray,
    *,
    sigma: float,
    test_fraction: float,
    seed: int,
    split: str = "all_rows",
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Seeded permutation and held-out test rows (``split``, see the module docstring);
    standardise on train, times sigma.

    Columns constant on the training split are centred only (their standard deviation is 0).
    Returns float32 ``(x_train, y_train, x_test, y_test)``.
    """
    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction}")
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    order = np.random.default_rng(seed).permutation(len(x))
    num_test = max(1, int(len(x) * test_fraction))
    # The authors' script trains on the first int(n (1 - f)) rows: one may be left unused.
    num_train = int(len(x) * (1 - test_fraction)) if split == "authors" else len(x) - num_test
    train, test = order[:num_train], order[-num_test:]
    mean, std = x[train].mean(axis=0), x[train].std(axis=0)
    scale = sigma / np.where(std > 0, std, 1.0)
    x_train, x_test = ((x[rows] - mean) * scale for rows in (train, test))
    return x_train.astype(np.float32), y[train], x_test.astype(np.float32), y[test]


def random_feature_scores(
    key: jax.Array,
    coupling: str,
    num_blocks: tuple[int, ...],
    x_train: jax.Array,
    onehot_train: jax.Array,
    x_test: jax.Array,
) -> jax.Array:
    """sum_{j in c} phi(x).phi(x_j) for every m = b d, b in ``num_blocks``, test x and class c.

    One projection of m_max = max(num_blocks) * d rows is drawn (blocks of d rows; inputs of the
    HD-product couplings must be padded to a power of two); the estimate with m = b d uses its
    first b blocks. Blocks are independent, so each prefix is an exact draw of that coupling
    with m rows (the estimates for different m are correlated within one draw, which does not
    matter for their means and standard errors over draws). Linear in the data: class sums
    S = onehot^T phi(X_train), shape (C, m), then phi(X_test) S^T restricted to each prefix.
    All features carry the factor 1/sqrt(m_max) instead of 1/sqrt(m), and test features are
    row-stabilised (each test row divided by its largest entry, so that far-away test points do
    not underflow to all-zero scores): both rescale a test point's scores by one positive factor
    and leave the predicted class unchanged.

    Returns:
      Scores of shape ``(len(num_blocks), N_test, C)``.
    """
    block = x_train.shape[-1]
    projection = projections.get(coupling)(key, block, max(num_blocks) * block)
    if projection.block_size not in (1, block):  # HD couplings need power-of-two inputs
        raise ValueError(
            f"coupling {coupling!r} draws blocks of {projection.block_size} rows for inputs of "
            f"dimension {block}; pad the inputs to a power of two"
        )
    phi_train = features.positive_features(x_train, projection, kernel="gaussian")
    phi_test = features.positive_features(x_test, projection, kernel="gaussian", stabilizer="row")
    class_sums = onehot_train.T @ phi_train  # (C, m)
    per_block = jnp.einsum(
        "tbk,cbk->btc",
        phi_test.reshape(len(x_test), -1, block),
        class_sums.reshape(class_sums.shape[0], -1, block),
    )
    prefix = jnp.cumsum(per_block, axis=0)
    return prefix[jnp.asarray(num_blocks) - 1]


@functools.partial(jax.jit, static_argnums=(1, 2))
def random_feature_accuracies(
    keys: jax.Array,
    couplings: tuple[str, ...],
    num_blocks: tuple[int, ...],
    x_train: jax.Array,
    onehot_train: jax.Array,
    x_test: jax.Array,
    y_test: jax.Array,
) -> jax.Array:
    """Test accuracy of the random-feature classifier per coupling, key and m.

    All couplings are compiled into one program (compilation, not arithmetic, dominates the
    small data sets); draws are vmapped over ``keys``, shape ``(len(couplings), R)``.

    Returns:
      Accuracies of shape ``(len(couplings), R, len(num_blocks))``.
    """

    def accuracies(coupling, key):
        scores = random_feature_scores(key, coupling, num_blocks, x_train, onehot_train, x_test)
        return jnp.mean(jnp.argmax(scores, axis=-1) == y_test, axis=-1)

    return jnp.stack(
        [
            jax.vmap(functools.partial(accuracies, coupling))(coupling_keys)
            for coupling, coupling_keys in zip(couplings, keys, strict=True)
        ]
    )
