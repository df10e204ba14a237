"""Property-based tests (hypothesis) that found defects in the adversarial sweeps of issues 18
and 19: kept so that the defects stay fixed. Settings are fixed and derandomised (the same
examples on every run), the example counts small so the file runs in seconds."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rfjax import data, features, kernels, ops, projections

FIXED = settings(
    derandomize=True,
    database=None,
    deadline=None,
    max_examples=25,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
FEW = settings(FIXED, max_examples=3)  # for properties that compile per example

NOT_AN_INTEGER = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.booleans(),
    st.text(max_size=3),
    st.none(),
    st.lists(st.integers(), max_size=2),
)


@FIXED
@given(dim=st.one_of(NOT_AN_INTEGER, st.integers(max_value=0)))
def test_simplex_directions_validates_dim(dim):
    # Found: simplex_directions(2.5) raised a JAX shape error naming no argument.
    with pytest.raises((TypeError, ValueError), match=r"\bdim\b"):
        projections.simplex_directions(dim)


@FIXED
@given(
    dtype=st.sampled_from([jnp.int8, jnp.int32, jnp.uint8, jnp.bool_, jnp.complex64, None, "i4"]),
    name=st.sampled_from(["gaussian", "orthogonal", "simplex", "givens", "halton"]),
)
def test_samplers_reject_non_floating_dtypes(dtype, name):
    # Found: an integer dtype silently gave float32 (simplex_directions); None meant float32.
    with pytest.raises(TypeError, match=r"\bdtype\b"):
        projections.get(name)(jax.random.key(0), 3, 4, dtype=dtype)


@FEW
@given(
    dim=st.integers(1, 6),
    num_features=st.integers(1, 9),
    batch=st.sampled_from([(0,), (2, 0), (0, 3)]),
    name=st.sampled_from(["givens", "gaussian", "hd_orthogonal", "circulant"]),
)
def test_projections_of_empty_batches_are_empty(dim, num_features, batch, name):
    # Found: givens applied to a (0, d) input raised ZeroDivisionError.
    projection = projections.get(name)(jax.random.key(0), dim, num_features)
    assert projection(jnp.zeros((*batch, dim))).shape == (*batch, num_features)


@FEW
@given(
    name=st.sampled_from(["angular_hybrid", "gaussian_hybrid", "cluster_hybrid", "positive"]),
    side=st.sampled_from(["query", "key"]),
    batch=st.sampled_from([(0,), (3, 0)]),
)
def test_feature_maps_of_empty_batches_are_empty(name, side, batch):
    # Found: the hybrids raised ZeroDivisionError on an empty batch.
    key = jax.random.key(1)
    feature_map = _init(features.get(name)(), key)
    projection = projections.gaussian(key, 3, 4)
    width = _features(feature_map, jnp.ones((1, 3)), projection, side=side).shape[-1]
    # The empty batch itself eagerly: the defect was in the eager call's shape arithmetic.
    assert feature_map.features(jnp.zeros((*batch, 3)), projection, side=side).shape == (
        *batch,
        width,
    )


# Module-level jitted helpers: each compiles once per map and shape, not op by op.
_init = jax.jit(lambda feature_map, key: feature_map.init(key, 3))
_features = jax.jit(
    lambda feature_map, x, projection, side: feature_map.features(x, projection, side=side),
    static_argnames="side",
)


FINITE = st.floats(-10, 10, allow_nan=False, width=32)


@FIXED
@given(
    x=st.lists(FINITE, min_size=3, max_size=3),
    y=st.lists(FINITE, min_size=3, max_size=3),
    position=st.integers(0, 2),
    bad=st.sampled_from([math.nan, -math.nan]),
    kernel=st.sampled_from(
        [
            kernels.angular,
            kernels.gaussian,
            kernels.softmax,
            kernels.linear,
            *(lambda a, b, n=n: kernels.arccos(a, b, order=n) for n in (0, 1, 2)),
        ]
    ),
)
def test_kernels_propagate_nan(x, y, position, bad, kernel):
    # Found: angular and arccos returned their zero-vector value (0 or 1/2) for NaN input.
    x = np.array(x, np.float32)
    x[position] = bad
    assert bool(jnp.isnan(kernel(jnp.asarray(x), jnp.asarray(y, jnp.float32))))


@FIXED
@given(
    z=st.lists(FINITE, min_size=1, max_size=6),
    w=st.lists(FINITE, min_size=1, max_size=6),
)
def test_apply_simplex_is_linear_or_rejects_one_dimension(z, w):
    # Found: d = 1 raised ZeroDivisionError.
    d = min(len(z), len(w))
    a, b = jnp.asarray(z[:d], jnp.float32), jnp.asarray(w[:d], jnp.float32)
    if d == 1:
        with pytest.raises(ValueError, match=r"d >= 2"):
            ops.apply_simplex(a)
        return
    np.testing.assert_allclose(*_simplex_of_sum_and_sum_of_simplices(a, b), atol=1e-4)


@jax.jit
def _simplex_of_sum_and_sum_of_simplices(a, b):
    return ops.apply_simplex(a + b), ops.apply_simplex(a) + ops.apply_simplex(b)


@FIXED
@given(index=st.integers(0, 5), bad=st.sampled_from([math.nan, math.inf, -math.inf]))
def test_cosine_features_reject_non_finite_offsets(index, bad):
    # Found: NaN offsets were accepted.
    projection = projections.gaussian(jax.random.key(0), 2, 6)
    offsets = features.random_offsets(jax.random.key(1), 6).at[index].set(bad)
    with pytest.raises(ValueError, match=r"\boffsets\b"):
        features.cosine_features(jnp.ones((2, 2)), projection, offsets)


@FIXED
@given(
    text=st.one_of(
        st.sampled_from(["nan", "NaN", "inf", "-Infinity", "1e999", "", "?", "0x1p3"]),
        st.text(alphabet="0123456789.eE+-naif", min_size=1, max_size=6),
    ),
    row=st.integers(0, 50),
)
def test_uci_fields_parse_to_finite_numbers_or_name_file_and_line(tmp_path, text, row):
    # Found: NaN and inf fields were accepted; bad fields were reported without file and line.
    with open(f"{data._uci.DEFAULT_UCI_DIR}/banknote.txt") as source:
        lines = source.read().splitlines()
    fields = lines[row].split(",")
    fields[1] = text
    lines[row] = ",".join(fields)
    (tmp_path / "banknote.txt").write_text("\n".join(lines) + "\n")
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if text.strip() and math.isfinite(value):
        x, _ = data.load_uci("banknote", data_dir=tmp_path)
        assert x[row, 1] == value
    else:
        with pytest.raises(ValueError, match=rf"banknote\.txt, line {row + 1}, column 2"):
            data.load_uci("banknote", data_dir=tmp_path)


# ------------------------------------------------------------------ issue 32's sweep


@FIXED
@given(
    position=st.integers(0, 7),
    which=st.sampled_from(["key", "value"]),
    bad=st.sampled_from([math.nan, math.inf, -math.inf]),
    masked=st.booleans(),
    causal=st.booleans(),
)
def test_exact_reference_reaches_only_the_rows_that_attend(position, which, bad, masked, causal):
    # Found: softmax_attention let a NaN value reach earlier causal rows and, masked, every row.
    from rfjax import attention

    q, k, v = jax.random.normal(jax.random.key(0), (3, 1, 8, 1, 4))
    mask = jnp.ones((1, 8), bool).at[0, position].set(not masked)
    perturbed = {"key": k, "value": v}
    perturbed[which] = perturbed[which].at[0, position].set(bad)
    before = np.asarray(attention.softmax_attention(q, k, v, mask=mask, causal=causal))
    after = np.asarray(attention.softmax_attention(q, **perturbed, mask=mask, causal=causal))
    attends = np.zeros(8, bool) if masked else (np.arange(8) >= position if causal else True)
    attends = np.broadcast_to(attends, (8,))
    assert np.all(np.isnan(after[0, attends]))
    np.testing.assert_array_equal(after[0, ~attends], before[0, ~attends])


@FIXED
@given(
    values=st.lists(st.sampled_from([0.0, 1.0, -1e9, -math.inf, 0.5, 2.0]), min_size=6, max_size=6)
)
def test_performer_masks_are_boolean_or_zero_one(values):
    # Found: an additive float mask (0 = attend, -1e9 = masked) was read as mask != 0 (inverted).
    from rfjax.nn._attention_masks import favor_mask

    mask = jnp.asarray([values], jnp.float32)  # (B, S) = (1, 6)
    read = lambda m: favor_mask(  # noqa: E731
        m, batch_shape=(1,), num_heads=1, query_length=6, key_length=6, causal=False
    )
    if set(values) <= {0.0, 1.0}:
        np.testing.assert_array_equal(read(mask).key_padding, mask != 0)
    else:
        with pytest.raises(ValueError, match="values other than 0 and 1"):
            read(mask)


@FEW
@given(norm=st.floats(60.0, 130.0), causal=st.booleans(), antithetic=st.booleans())
def test_positive_attention_gradients_are_finite_at_large_norms(norm, causal, antithetic):
    # Found: causal FAVOR with positive features had NaN gradients from |q| = |k| = 110.
    from rfjax import attention

    kq, kk, kv = jax.random.split(jax.random.key(0), 3)
    unit = lambda key: (lambda x: x / jnp.linalg.norm(x, axis=-1, keepdims=True))(  # noqa: E731
        jax.random.normal(key, (1, 16, 1, 64))
    )
    q, k, v = norm * unit(kq), norm * unit(kk), jax.random.normal(kv, (1, 16, 1, 64))
    w = projections.orthogonal(jax.random.key(1), 64, 64)
    name = "positive_antithetic" if antithetic else "positive"

    def loss(q, k, v):
        out = attention.favor_attention(q, k, v, w, feature_map=name, causal=causal, chunk_size=8)
        return jnp.sum(out * v[..., ::-1])

    for grad in jax.grad(loss, (0, 1, 2))(q, k, v):
        assert np.all(np.isfinite(np.asarray(grad)))
