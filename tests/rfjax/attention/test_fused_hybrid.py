"""The angular hybrid's fused kernels (``rfjax/attention/_fused_hybrid.py``) in interpret mode:
values and gradients against the XLA form (masks, padding, per-head projections), the rows the
XLA form floors, and |q| = |k| = 100 / 120 against the float64 log-space reference. Their lowering
for Triton and Mosaic TPU is checked beside the affine kernels' in ``test_fused.py``.

Tolerances: the hybrid's scores are signed, so the kernels and the XLA form, summing the same
terms in different orders in float32, agree to 64 eps32 of the terms' magnitudes
sum_j |psi(q_t)| |psi(k_j)| e^(s_j - c_t) (``assert_rows_close``), not of the scores' sum."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rfjax import attention, features, projections
from tests.rfjax.attention.test_fused import (
    HEAD_DIM,
    HEADS,
    LENGTH,
    TOLERANCE,
    assert_close,
    fused_and_xla,
    operands,
)
from tests.rfjax.attention.test_large_norms import HEAD_DIM as LARGE_HEAD_DIM
from tests.rfjax.attention.test_large_norms import inputs, ready_map, reference, scaled_features
from tests.support.compiled import jitted
from tests.support.interpret_mode import INTERPRET_MODE
from tests.support.representatives import representatives


def angular_hybrid(num_signs=2, dim=HEAD_DIM):
    return features.AngularHybridFeatureMap(num_sign_features=num_signs).init(
        jax.random.key(10), dim
    )


def xla_unit_scores(q, k, mask, projection, fmap, causal, head, *, absolute=False):
    """One head's scores S_tj in the XLA form's units, float64: psi(q_t) . psi(k_j)
    e^{s(k_j) - c_t} (``scaled_features``: the query's scale dropped, c_t the largest s(k_j)
    over the keys row t attends to), 0 where it does not attend; attention's inputs scaled by
    H^{-1/4}. With ``absolute``, the sums of the terms' magnitudes |psi(q_t)| . |psi(k_j)|
    e^{s(k_j) - c_t} instead (Lemma 2.3's flat features: the signed ones cancel)."""
    with jax.enable_x64(True):
        proj, f = (
            jax.tree.map(lambda x: jnp.asarray(x, jnp.float64), x)
            for x in (
                projection
                if isinstance(projection, projections.Projection)
                else projection.head(head),
                fmap,
            )
        )
        dim = q.shape[-1]
        rows = [jnp.asarray(x[0, :, head], jnp.float64) * dim**-0.25 for x in (q, k)]
        psi_q, _ = scaled_features(f, rows[0], proj, side="query")
        psi_k, s_k = (np.asarray(x) for x in scaled_features(f, rows[1], proj, side="key"))
    psi_q = np.abs(np.asarray(psi_q)) if absolute else np.asarray(psi_q)
    psi_k = np.abs(psi_k) if absolute else psi_k
    length = q.shape[1]
    allowed = np.asarray(mask[0])[None, :] & (
        np.tril(np.ones((length, length), bool)) if causal else True
    )
    shift = np.max(np.where(allowed, s_k[None, :], -np.inf), axis=1, keepdims=True)
    return np.where(allowed, (psi_q @ psi_k.T) * np.exp(s_k[None, :] - shift), 0.0)


def assert_rows_close(got, want, scores, magnitudes, value, eps):
    """Per row t: |got_t - want_t| <= ``TOLERANCE`` sum_j A_tj max|v| / max(sum_j S_tj, eps),
    A the terms' magnitudes (``xla_unit_scores(..., absolute=True)``): each term carried to a
    few ulps, divided by the floored normaliser (rows whose normaliser is below eps, negative
    ones included, are divided by eps). The kernels sum the terms in another order than the
    XLA form (lambda P + (1 - lambda) R, not Lemma 2.3's flat features): their difference is
    bounded by the terms', not by the sum of the signed scores |S_tj|, which the XLA form's own
    error against float64 exceeds."""
    bound = magnitudes.sum(1) * np.abs(np.asarray(value, np.float64)).max()
    bound = TOLERANCE * bound / np.maximum(scores.sum(1), eps)
    error = np.abs(np.asarray(got, np.float64) - np.asarray(want, np.float64)).max(1)
    assert np.all(error <= bound), (error, bound)


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "bidirectional"])
@INTERPRET_MODE
def test_angular_hybrid_matches_the_xla_form_values_and_gradients(causal):
    """The angular hybrid's features formed inside the kernels (positive and trigonometric
    bases, sign channels) give the XLA form's outputs (per row, ``assert_rows_close``) and
    gradients (queries, keys, values, per-head projections; ``TOLERANCE`` times the largest
    row condition number sum_j |S_tj| / |sum_j S_tj|), masked, over 2 chunks with a partial
    one. m = 20: 2m = 40 features in five tiles of 8 (2m is no multiple of ``FEATURE_TILE`` =
    16), a number of tiles that is not a power of two (the kernels' dW2 tiles are padded to
    eight); the other tests take m = 32, four tiles of 16."""
    assert_matches_the_xla_form("pallas_triton_interpret", causal, features=20)


@INTERPRET_MODE
def test_angular_hybrid_carries_growing_keys_over_three_chunks():
    """Causal, three chunks (150 rows, the last partial) whose keys grow along the sequence
    (norms x 0.5 ... 1.5): each chunk has keys above the running maximum c of the chunks
    before it, so its rows read the earlier state with e^{c - c_t} < 1 (in the output kernel
    and the queries' summaries of the backward pass; over the 80 rows of the test above every
    c_t stayed at c and a factor 1 gave the same sums). m = 16, one tile."""
    growth = jnp.linspace(0.5, 1.5, 150)
    assert_matches_the_xla_form("pallas_triton_interpret", True, 16, length=150, growth=growth)


@pytest.mark.skipif(jax.default_backend() != "gpu", reason="compiles the kernels for a GPU")
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "bidirectional"])
def test_angular_hybrid_pallas_triton_on_the_gpu_matches_the_xla_form(causal):
    """The kernels compiled by Triton (``benchmarks.gpu_run``'s tests step), the check above on
    the device at m = 24 (Triton takes 2m in tiles of 16: three, the dW2 carry padded to
    four), with every product of both forms in float32 (``jax.default_matmul_precision``), so
    that its CPU tolerance holds."""
    with jax.default_matmul_precision("float32"):
        assert_matches_the_xla_form("pallas_triton", causal, features=24)


def assert_matches_the_xla_form(implementation, causal, features, length=LENGTH, growth=None):
    """``implementation``'s outputs (per row, ``assert_rows_close``) and gradients (TOLERANCE
    times the largest row condition number) against the XLA form's, m = ``features``, the keys
    of ``length`` positions scaled by ``growth`` ``(length,)`` if given."""
    q, k, v, mask, projection = operands(11, scale=2.0, features=features, length=length)
    if growth is not None:
        k = k * growth[None, :, None, None]
    fmap = angular_hybrid()
    weights = jax.random.normal(jax.random.key(12), v.shape)
    options = dict(feature_map=fmap, causal=causal, mask=mask)
    results = fused_and_xla(q, k, v, projection, weights, implementation, **options)
    (fused, fused_grads), (xla, xla_grads) = results
    condition = 1.0
    for head in range(HEADS):
        scores = xla_unit_scores(q, k, mask, projection, fmap, causal, head)
        magnitudes = xla_unit_scores(q, k, mask, projection, fmap, causal, head, absolute=True)
        assert_rows_close(
            fused[0, :, head], xla[0, :, head], scores, magnitudes, v[0, :, head], 1e-3
        )
        attends = np.abs(scores).sum(1) > 0
        rows = np.abs(scores).sum(1)[attends] / np.abs(scores.sum(1))[attends]
        condition = max(condition, rows.max())
    for got, want in zip(jax.tree.leaves(fused_grads), jax.tree.leaves(xla_grads), strict=True):
        assert_close(got, want, TOLERANCE * condition)


@INTERPRET_MODE
def test_angular_hybrid_takes_float32_products_for_bfloat16_inputs():
    """bfloat16 inputs: the hybrid's bases are signed and its scores' sums cancel, so a
    bfloat16 operand's rounding would be amplified by a row's condition number; the kernels
    take float32 operands whatever the inputs' dtype (``AngularHybridSpec.operand_dtype``), as
    the XLA form computes the hybrid. The outputs then agree to within one bfloat16 spacing of
    the output (2^-7 of its size); with bfloat16 operands 126 of the 640 outputs were not, one
    off by 13% (-270 against -312).
    m = 3 (n = 2 signs), where the estimates cancel the most."""
    q, k, v, mask, projection = operands(18, scale=1.5, dtype=jnp.bfloat16, features=3)
    outs = [
        jitted(attention.favor_attention)(
            q,
            k,
            v,
            projection,
            feature_map=angular_hybrid(),
            causal=True,
            mask=mask,
            implementation=implementation,
        )
        for implementation in ("pallas_triton_interpret", "xla")
    ]
    fused, xla = (np.asarray(out.astype(jnp.float32), np.float64) for out in outs)
    assert np.all(np.abs(fused - xla) <= 2.0**-7 * np.abs(xla)), np.abs(fused - xla).max()


# The bidirectional kernels share the causal ones' in-block code: CI runs them (statistical).
@pytest.mark.parametrize(
    "causal", representatives([True, False], [True]), ids=["causal", "bidirectional"]
)
@INTERPRET_MODE
def test_angular_hybrid_floors_the_rows_the_xla_form_floors(causal):
    """|q| = |k| = 8 (H = 64, m = 32): some rows' estimated normalisers are below the signed
    maps' floor eps = 1e-3 (in the XLA form's units) and are clipped; the kernels express their
    sums in the same units, so the same rows are clipped to the same outputs."""
    fmap = ready_map("angular_hybrid")
    projection = projections.orthogonal(jax.random.key(1), LARGE_HEAD_DIM, 32)
    query, key, value = inputs(8, jnp.float32, length=32)
    mask = jnp.ones((1, 32), bool)
    outs = [
        jitted(attention.favor_attention)(
            query, key, value, projection, feature_map=fmap, causal=causal, implementation=i
        )[0, :, 0]
        for i in ("pallas_triton_interpret", "xla")
    ]
    scores = xla_unit_scores(query, key, mask, projection, fmap, causal, 0)
    magnitudes = xla_unit_scores(query, key, mask, projection, fmap, causal, 0, absolute=True)
    assert np.sum(scores.sum(1) < 1e-3) >= 1  # rows the floor clips
    assert_rows_close(*outs, scores, magnitudes, value[0, :, 0], 1e-3)


@pytest.mark.parametrize(
    ("norm", "causal"),
    representatives(
        [(n, c) for n in (100, 120) for c in (True, False)], [(120, True)], unpack=True
    ),
)
@INTERPRET_MODE
def test_angular_hybrid_at_large_norms_matches_float64(norm, causal):
    """|q| = |k| = 100 and 120 (H = 64, m = 32, n = 8 signs): the kernels' outputs against the
    float64 FAVOR of the same map (``test_attention_large_norms.reference``: the XLA form's
    per-key shift in float64, rows with a normaliser above 2 eps, its tolerance), as the XLA
    form is checked at norm 100 (``test_every_map_at_norm_100_is_finite_and_matches_float64``);
    finite gradients. The trigonometric base's e^{|x'|^2/2} (e^900 at 120) is never formed."""
    fmap = ready_map("angular_hybrid")
    projection = projections.orthogonal(jax.random.key(1), LARGE_HEAD_DIM, 32)
    query, key, value = inputs(norm, jnp.float32, length=16)

    def run(q, k, v):
        return attention.favor_attention(
            q,
            k,
            v,
            projection,
            feature_map=fmap,
            causal=causal,
            implementation="pallas_triton_interpret",
        )

    def loss(q, k, v):
        out = run(q, k, v)
        return jnp.sum(out * v[..., ::-1]), out

    grads, out = jax.jit(jax.grad(loss, (0, 1, 2), has_aux=True))(query, key, value)
    expected, tolerance = reference(query, key, value, fmap, projection, causal=causal, eps=1e-3)
    checked = np.isfinite(tolerance)
    assert checked.sum() >= 2
    error = np.abs(np.asarray(out, np.float64)[0, :, 0] - expected).max(1)
    assert np.all(error[checked] <= tolerance[checked]), (error, tolerance)
    for grad in grads:
        assert np.all(np.isfinite(np.asarray(grad)))
