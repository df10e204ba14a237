"""FAVOR at large query/key norms (issue 19 item 1): finite outputs and gradients, and outputs
equal to the exact float64 result of the same features, where float32 used to give NaN
gradients (the derivative -num/den^2 of the normalisation) and rows collapsing to 0."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy.special import logsumexp

from rfjax import attention, projections

LENGTH, HEAD_DIM, NUM_FEATURES = 32, 64, 128
EPS32 = float(np.finfo(np.float32).eps)


def inputs(norm, dtype):
    """q, k of norm exactly ``norm`` (random directions), v standard normal: (1, T, 1, H)."""
    kq, kk, kv = jax.random.split(jax.random.key(norm), 3)

    def directions(key):
        x = jax.random.normal(key, (1, LENGTH, 1, HEAD_DIM))
        return x / jnp.linalg.norm(x, axis=-1, keepdims=True)

    q, k = norm * directions(kq), norm * directions(kk)
    v = jax.random.normal(kv, (1, LENGTH, 1, HEAD_DIM))
    return tuple(x.astype(dtype) for x in (q, k, v))


def exact(query, key, value, weights, *, antithetic, causal):
    """float64 attention with the positive features' scores computed in log space:
    A_tj = softmax_j(logsumexp_i(l_i(q_t) + l_i(k_j))), l = log of the features (no underflow)."""

    def log_features(x):
        x = np.asarray(x, np.float64)[0, :, 0] * HEAD_DIM**-0.25
        projected = x @ weights.T
        if antithetic:
            projected = np.concatenate([projected, -projected], -1)
        return projected - 0.5 * np.sum(x * x, -1, keepdims=True)

    lq, lk = log_features(query), log_features(key)
    scores = logsumexp(lq[:, None, :] + lk[None, :, :], axis=-1)
    if causal:
        scores = np.where(np.tril(np.ones(scores.shape, bool)), scores, -np.inf)
    scores = np.exp(scores - scores.max(-1, keepdims=True))
    out = (scores / scores.sum(-1, keepdims=True)) @ np.asarray(value, np.float64)[0, :, 0]
    # Tolerance: each log-feature is rounded in float32 with an absolute error of a few
    # eps * |l| (|l| ~ |x'|^2 / 2 + |w.x'|, hundreds here); a score moves by e^{delta} - 1 ~ delta
    # relative, the output (a convex combination of values) by ~2 delta max|v|. 16 roundings.
    delta = 16 * EPS32 * max(np.abs(lq).max(), np.abs(lk).max())
    return out, 2 * delta * np.abs(np.asarray(value, np.float64)).max()


@pytest.mark.parametrize(
    ("feature_map", "norms", "dtypes"),
    [
        # Quick: the case that failed before (NaN gradients from |q| = |k| = 80, causal).
        ("positive", (40, 80, 100), (jnp.float32,)),
        pytest.param("positive", (40, 80, 100), (jnp.bfloat16,), marks=pytest.mark.slow, id="bf16"),
        pytest.param(
            "positive_antithetic",
            (40, 80),
            (jnp.float32, jnp.bfloat16),
            marks=pytest.mark.slow,
            id="antithetic",
        ),
    ],
)
def test_large_norms_finite_and_exact(feature_map, norms, dtypes):
    projection = projections.orthogonal(jax.random.key(1), HEAD_DIM, NUM_FEATURES)
    weights = np.asarray(projection.matrix(), np.float64)
    for causal in (True, False):

        def run(q, k, v, causal=causal):
            return attention.favor_attention(
                q, k, v, projection, feature_map=feature_map, causal=causal, chunk_size=8
            )

        loss = jax.jit(jax.grad(lambda *x: jnp.sum(run(*x).astype(jnp.float32) ** 2), (0, 1, 2)))
        for dtype in dtypes:
            for norm in norms:
                query, key, value = inputs(norm, dtype)
                out = np.asarray(run(query, key, value), np.float64)[0, :, 0]
                expected, tolerance = exact(
                    query,
                    key,
                    value,
                    weights,
                    antithetic=feature_map == "positive_antithetic",
                    causal=causal,
                )
                if dtype == jnp.bfloat16:  # plus the output's rounding to bfloat16
                    tolerance += 2.0**-8 * np.abs(expected).max()
                np.testing.assert_allclose(out, expected, rtol=0, atol=tolerance)
                for grad in loss(query, key, value):
                    assert np.all(np.isfinite(np.asarray(grad, np.float32))), (causal, norm)
