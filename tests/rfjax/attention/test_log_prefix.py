"""The per-feature causal prefix op (``_log_prefix``) against its float64 quadratic form, values
and gradients, at log-features that span far more than float32's range, and its causality; with
the feature map fused in (gradients of the rows and the map's parameters); both schedules (the
CPU's fused scan and the accelerators' batched passes)."""

import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rfjax import projections
from rfjax.attention import _chunks, _log_prefix, favor_attention
from rfjax.attention._log_prefix import (
    causal_feature_prefix,
    causal_log_prefix,
    causal_log_prefix_quadratic,
    identity_logs,
    initial_state_cotangent,
    key_state,
)
from tests.support.representatives import representatives

LENGTH, WIDTH, VALUES = 13, 5, 3


def operands(key=0):
    """(la, lb, v, g) float64: log-features with a spread of ~300 (e^300 overflows float32;
    keys offset by -500, as at |k'| ~ 32), values and a cotangent."""
    k = jax.random.split(jax.random.key(key), 4)
    with jax.enable_x64(True):
        la = 100.0 * jax.random.normal(k[0], (LENGTH, WIDTH), jnp.float64)
        lb = 100.0 * jax.random.normal(k[1], (LENGTH, WIDTH), jnp.float64) - 500.0
        v = jax.random.normal(k[2], (LENGTH, VALUES), jnp.float64)
        g = jax.random.normal(k[3], (LENGTH, VALUES), jnp.float64)
    return la, lb, v, g


SCHEDULES = ("fused_scan", "batched")


def schedules_and_chunks(chunks, keep):
    """(schedule, chunk) cases: ``keep`` in the default suite, the others statistical."""
    cases = [(s, c) for s in SCHEDULES for c in chunks]
    return representatives(cases, keep, unpack=True)


@pytest.fixture
def schedule(request, monkeypatch):
    """Both schedules of the op on this CPU: the fused scan (with segments as short as
    ``_segment_length`` allows, so that a few chunks already make several segments and the
    backward pass forms their states again from checkpoints) and the accelerators' batched
    passes (with one chunk per step, so the grouped scans and their padding run too)."""
    if request.param == "fused_scan":
        monkeypatch.setattr(_log_prefix, "MIN_SEGMENT", 1)
    if request.param == "batched":
        monkeypatch.setattr(_chunks, "fused_chunk_scan", lambda platform: False)
        monkeypatch.setattr(_chunks, "CHUNKS_PER_STEP", 3)
    return request.param


@pytest.mark.parametrize(  # 64: one chunk, clipped to T
    ("schedule", "chunk"),
    schedules_and_chunks([1, 4, 64], {("fused_scan", 4), ("batched", 1)}),
    indirect=["schedule"],
)
def test_matches_quadratic_form_in_float64_values_and_gradients(chunk, schedule):
    la, lb, v, g = operands()
    with jax.enable_x64(True):

        def loss(op):
            return lambda *x: jnp.sum(op(*x) * g)

        @jax.jit  # one program (this schedule's: traced here)
        def values_and_gradients(la, lb, v):
            out, shift = causal_log_prefix(la, lb, v, chunk)
            expected = causal_log_prefix_quadratic(la, lb, v, shift)
            grads = jax.grad(loss(lambda *x: causal_log_prefix(*x, chunk)[0]), (0, 1, 2))(la, lb, v)
            fixed = jax.grad(loss(lambda *x: causal_log_prefix_quadratic(*x, shift)), (0, 1, 2))(
                la, lb, v
            )
            return out, expected, grads, fixed

        out, expected, grads, fixed = values_and_gradients(la, lb, v)
        np.testing.assert_allclose(out, expected, rtol=1e-12, atol=1e-12 * np.abs(expected).max())
        for got, want in zip(grads, fixed, strict=True):
            np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12 * np.abs(want).max())


def test_largest_term_of_every_row_is_one_in_float32():
    """M_t is the row's largest exponent: the ones column sums to >= 1 (no row underflows) and
    every term <= 1 (nothing overflows), though the terms span e^-1000..e^0; float32 values
    match float64 to the rounding of exponents of size ~800."""
    la, lb, v, _ = operands(1)
    ones = np.concatenate([np.asarray(v), np.ones((LENGTH, 1))], axis=-1)
    prefix = jax.jit(lambda *x: causal_log_prefix(*x, 4))
    out, shift = prefix(*(jnp.asarray(x, jnp.float32) for x in (la, lb, ones)))
    assert np.all(np.asarray(out[:, -1]) >= 1.0)
    assert np.all(np.asarray(out[:, -1]) <= np.arange(1, LENGTH + 1) * WIDTH)
    with jax.enable_x64(True):
        quadratic = jax.jit(causal_log_prefix_quadratic)
        expected = quadratic(la, lb, ones, jnp.asarray(shift, jnp.float64))
    # Each exponent la + lb - M (|.| <= ~1000) is rounded with error ~4 eps32 * 1000 = 5e-4.
    tolerance = 4 * float(np.finfo(np.float32).eps) * 1000 * np.abs(expected).max()
    np.testing.assert_allclose(out, expected, rtol=0, atol=tolerance)


def test_later_positions_cannot_reach_earlier_rows():
    """Rows t < 7 are bit-identical, and the gradients finite, whatever positions >= 7 hold
    (here key log-features of 3e38, whose sums with earlier rows' la would overflow to inf)."""
    la, lb, v, g = (jnp.asarray(x, jnp.float32) for x in operands(2))
    later = jnp.arange(LENGTH)[:, None] >= 7
    wild_la, wild_lb = jnp.where(later, la + 1e3, la), jnp.where(later, 3e38, lb)
    wild_v = jnp.where(later, 1e30, v)
    prefix = jax.jit(lambda *x: causal_log_prefix(*x, 4))
    out, shift = prefix(la, lb, v)
    wild_out, wild_shift = prefix(wild_la, wild_lb, wild_v)
    np.testing.assert_array_equal(wild_out[:7], out[:7])
    np.testing.assert_array_equal(wild_shift[:7], shift[:7])

    def loss(*x):
        return jnp.sum(causal_log_prefix(*x, 4)[0][:7] * g[:7])

    for grad in jax.jit(jax.grad(loss, (0, 1, 2)))(wild_la, wild_lb, wild_v):
        assert np.all(np.isfinite(np.asarray(grad)))


@pytest.mark.parametrize(  # 20: two blocks of 16, T = 13 padded
    ("schedule", "chunk"),
    # The batched schedule's key pass with an initial state is run only here (the test above
    # passes none): at chunk 3 its running maxima over chunks, at 20 its first start c_0.
    schedules_and_chunks([3, 20, 64], {("fused_scan", 20), ("batched", 3), ("batched", 20)}),
    indirect=["schedule"],
)
def test_state_pieces_match_their_direct_forms(chunk, schedule):
    """The pieces of sequence parallelism's VJP (issue 32): ``key_state`` (the keys' own state),
    ``initial_state_cotangent`` and the op with an initial state and its own state as a second
    output, values and gradients, against their direct float64 forms."""
    la, lb, v, g = operands(3)
    with jax.enable_x64(True):
        valid = jnp.arange(LENGTH) % 5 != 2
        options = dict(log_features=_log_prefix.identity_logs, chunk=chunk)

        def direct(x, y, rows, features):
            return jnp.exp(x + features[None, :] - rows[:, None]).T @ y

        initial_state = jnp.asarray(np.ones((WIDTH, VALUES)))
        state_cotangent = jnp.asarray(np.arange(WIDTH * VALUES).reshape(WIDTH, VALUES) / 7.0)

        @jax.jit  # one program (this schedule's: traced here)
        def pieces(la, lb, v, g):
            state, shift = key_state(None, lb, v, valid, **options)
            own_shift = jnp.max(jnp.where(valid[:, None], lb, -jnp.inf), axis=0)
            want_state = direct(
                jnp.where(valid[:, None], lb, -jnp.inf), v, jnp.zeros(LENGTH), -own_shift
            )
            row_shift = jnp.max(la, axis=1) + 7.0
            initial_shift = jnp.max(lb, axis=0) - 3.0  # exponents la + c - M <= 0 for these
            got = initial_state_cotangent(None, la, row_shift, initial_shift, g, **options)
            want = direct(la, g, row_shift, initial_shift)

            def fused(la, lb, v, state):
                result = causal_feature_prefix(
                    None,
                    la,
                    lb,
                    v,
                    valid,
                    initial=(state, initial_shift),
                    with_own_state=True,
                    **options,
                )
                return result.out, result.own_state

            def separate(la, lb, v, state):
                result = causal_feature_prefix(
                    None, la, lb, v, valid, initial=(state, initial_shift), **options
                )
                masked = jnp.where(valid[:, None], lb, -jnp.inf)
                earlier = jnp.exp(la + initial_shift - result.row_shift[:, None]) @ state
                quadratic = causal_log_prefix_quadratic(la, masked, v, result.row_shift) + earlier
                own = direct(masked, v, jnp.zeros(LENGTH), -own_shift)
                return quadratic, own

            cotangents = (
                jax.vjp(fused, la, lb, v, initial_state)[1]((g, state_cotangent)),
                jax.vjp(separate, la, lb, v, initial_state)[1]((g, state_cotangent)),
            )
            values = (fused(la, lb, v, initial_state), separate(la, lb, v, initial_state))
            return (state, shift, own_shift, want_state), (got, want), cotangents, values

        (state, shift, own_shift, want), cotangent_pair, cotangents, values = pieces(la, lb, v, g)
        np.testing.assert_array_equal(shift, own_shift)
        np.testing.assert_allclose(state, want, rtol=1e-12, atol=1e-12 * np.abs(want).max())
        got, want = cotangent_pair
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12 * np.abs(want).max())
        for got, want in zip(*cotangents, strict=True):
            np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-10 * np.abs(want).max())
        pairs = zip(*values, strict=True)
        for got, want in pairs:
            np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12 * np.abs(want).max())


def _positive_logs(weights, rows, side):
    """FAVOR+'s log-features exp(W x - |x|^2 / 2) / sqrt(m), written out."""
    del side
    return rows @ weights.T - 0.5 * jnp.sum(rows**2, -1, keepdims=True) - 0.5 * jnp.log(8.0)


@pytest.mark.parametrize(
    ("schedule", "chunk"),
    # The batched schedule at chunk 4 (4 chunks, 3 a step) sums the map's parameters'
    # cotangents over a step's chunks (``_accumulate_chunks``): the accelerators' only path.
    schedules_and_chunks([4, 32], {("fused_scan", 4), ("batched", 4)}),
    indirect=["schedule"],
)
def test_fused_feature_map_values_and_gradients_of_rows_and_parameters(chunk, schedule):
    """With the map fused in, values and the gradients of queries, keys, values and the map's
    parameters equal autodiff through the float64 quadratic form of the map's features (masked
    keys, large norms)."""
    k = jax.random.split(jax.random.key(4), 5)
    with jax.enable_x64(True):
        q, kk = (6.0 * jax.random.normal(x, (LENGTH, 4), jnp.float64) for x in k[:2])
        v = jax.random.normal(k[2], (LENGTH, VALUES), jnp.float64)
        g = jax.random.normal(k[3], (LENGTH, VALUES), jnp.float64)
        weights = projections.gaussian(k[4], 4, 8, dtype=jnp.float64).matrix()
        valid = jnp.arange(LENGTH) % 4 != 1

        def fused(weights, q, kk, v):
            return causal_feature_prefix(
                weights, q, kk, v, valid, log_features=_positive_logs, chunk=chunk
            ).out

        @jax.jit  # one program (this schedule's: traced here)
        def values_and_cotangents(weights, q, kk, v, g):
            shift = jax.lax.stop_gradient(
                causal_feature_prefix(
                    weights, q, kk, v, valid, log_features=_positive_logs, chunk=chunk
                ).row_shift
            )

            def quadratic(weights, q, kk, v):
                la, lb = _positive_logs(weights, q, "query"), _positive_logs(weights, kk, "key")
                lb = jnp.where(valid[:, None], lb, -jnp.inf)
                return causal_log_prefix_quadratic(la, lb, jnp.where(valid[:, None], v, 0), shift)

            got = jax.vjp(fused, weights, q, kk, v)[1](g)
            want = jax.vjp(quadratic, weights, q, kk, v)[1](g)
            return fused(weights, q, kk, v), quadratic(weights, q, kk, v), got, want

        out, expected, got, want = values_and_cotangents(weights, q, kk, v, g)
        np.testing.assert_allclose(out, expected, rtol=1e-11, atol=1e-12)
        for a, b in zip(got, want, strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-10 * np.abs(b).max())


def test_gradients_inside_shard_map_with_replicated_parameters():
    """Causal FAVOR inside ``shard_map`` with the rows split over a mesh axis (data parallelism:
    the batch over ``"data"``) and the projection replicated: the op's parameters and its zero
    initial state enter varying like the rows, so the pullback returns each cotangent with its
    primal's type (the parameters' summed over the devices). Until 2026-11-28 the initial
    state's cotangent came back varying and every gradient raised (the long-context benchmark's
    FAVOR training step did not compile). One device, so the gradients equal one program's."""
    k = jax.random.split(jax.random.key(11), 4)
    query, key, value = (0.5 * jax.random.normal(x, (2, 40, 2, 8)) for x in k[:3])
    projection = projections.gaussian(k[3], 8, 16).matrix()
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]), ("data",))
    spec = jax.sharding.PartitionSpec

    def attend(projection, query, key, value):
        return favor_attention(query, key, value, projection, causal=True, chunk_size=16)

    split = jax.shard_map(
        attend, mesh=mesh, in_specs=(spec(),) + (spec("data"),) * 3, out_specs=spec("data")
    )

    def gradients(attend):
        loss = lambda *args: jnp.sum(attend(*args) ** 2)  # noqa: E731
        return jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3)))(projection, query, key, value)

    for got, want in zip(gradients(split), gradients(attend), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6 * np.abs(want).max())


# Gradients of favor_attention in eager mode (the forward and backward programs compiled apart),
# batch 2 x 3 heads, one chunk and several: while the backward pass of a one-chunk sequence
# carried a zero state of later queries, XLA's CPU backend folded it into the in-block sums'
# YNNPACK reduce fusion, which read memory it never wrote, so dk came back NaN in some
# processes; glibc's MALLOC_PERTURB_ fills fresh allocations with 0xfe, which made it NaN in
# every one.
_UNWRITTEN_MEMORY_PROBE = """
import jax, jax.numpy as jnp, numpy as np
from rfjax import attention, projections
finite = []
# One chunk each (T < C = 64): B, T, N, H, m, H_v.
for batch, length, heads, dim, features, width in ((2, 24, 3, 16, 32, 8), (4, 32, 2, 64, 64, 64)):
    projection = projections.gaussian(jax.random.key(100), dim, features)
    kq, kk, kv = jax.random.split(jax.random.key(9), 3)
    query = 0.5 * jax.random.normal(kq, (batch, length, heads, dim))
    key = 0.5 * jax.random.normal(kk, (batch, length, heads, dim))
    value = jax.random.normal(kv, (batch, length, heads, width))
    out, pullback = jax.vjp(
        lambda q, k, v: attention.favor_attention(q, k, v, projection, causal=True),
        query,
        key,
        value,
    )
    finite += [bool(np.all(np.isfinite(np.asarray(x)))) for x in (out, *pullback(2 * out))]
print(all(finite))
"""


@pytest.mark.integration
@pytest.mark.skipif(jax.default_backend() != "cpu", reason="glibc's allocator on the CPU backend")
def test_gradients_read_no_unwritten_memory():
    # Eight processes, as the defects showed in some processes only: one with glibc's
    # MALLOC_PERTURB_ (0xfe in fresh allocations: NaN dk in every process before the one-chunk
    # backward pass was formed without its zero state), seven without it (B = 4, T = 32,
    # H = H_v = m = 64: NaN outputs or gradients in about 1 process of 3 before the one-chunk
    # passes were formed without their zero state, _one_chunk_without_state; so about 6% of
    # runs of this test would miss that defect).
    base = dict(os.environ, JAX_PLATFORMS="cpu")
    base.pop("JAX_COMPILATION_CACHE_DIR", None)
    base.pop("MALLOC_PERTURB_", None)
    envs = [dict(base, MALLOC_PERTURB_="1")] + [base] * 7
    runs = [
        subprocess.Popen(
            [sys.executable, "-c", _UNWRITTEN_MEMORY_PROBE],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for env in envs
    ]
    for run in runs:
        stdout, stderr = run.communicate(timeout=300)
        assert run.returncode == 0, stderr
        assert stdout.split()[-1] == "True", stdout + stderr


def allowed(k, chunks, shortest):
    """Whether K = ``k`` may be a segment's length for ``chunks`` chunks."""
    return chunks % k == 0 and k * k >= chunks and (k >= shortest or k == chunks)


def test_segments_divide_the_chunks_and_are_the_shortest_allowed(monkeypatch):
    """The CPU schedule's backward pass keeps n / K checkpoints and forms K states at a time:
    K divides n, K^2 >= n and K >= ``MIN_SEGMENT`` (or K = n), and no shorter divisor would
    do (so n / K + K is about 2 sqrt(n) for long sequences)."""
    for shortest in (1, _log_prefix.MIN_SEGMENT):
        monkeypatch.setattr(_log_prefix, "MIN_SEGMENT", shortest)

        for chunks in range(1, 300):
            length = _log_prefix._segment_length(chunks)
            assert allowed(length, chunks, shortest), (shortest, chunks)
            assert not any(allowed(k, chunks, shortest) for k in range(1, length))
    assert _log_prefix._segment_length(1024) == 32
    assert _log_prefix._segment_length(16) == 16


@pytest.mark.parametrize(  # shared parameters: every favor_attention test's default
    "head_axes", representatives([None, 0], {0}), ids=["shared", "per_head"]
)
def test_heads_at_once_equal_each_head_alone_values_and_gradients(head_axes):
    """Rows ``(T, N, H)`` (the op maps over the heads inside each chunk's step) give each
    head's outputs, flags, normaliser column and the gradients of its rows and of the map's
    parameters (shared: summed over the heads; per head: each head's own), as one head's rows
    ``(T, H)`` do; non-finite rows are left out and flagged per head."""
    heads, length, chunk = 3, 40, 16
    k = jax.random.split(jax.random.key(7), 5)
    with jax.enable_x64(True):
        q, kk = (3.0 * jax.random.normal(x, (length, heads, 4), jnp.float64) for x in k[:2])
        kk = kk.at[9, 1].set(jnp.nan)  # one head's key row
        q = q.at[30, 2].set(jnp.inf)  # one head's query row
        v = jax.random.normal(k[2], (length, heads, VALUES), jnp.float64)
        g = jax.random.normal(k[3], (length, heads, VALUES + 1), jnp.float64)
        shape = (heads, 8, 4) if head_axes == 0 else (8, 4)
        weights = jax.random.normal(k[4], shape, jnp.float64)
        valid = jnp.arange(length) % 5 != 2
        options = dict(log_features=_positive_logs, chunk=chunk, normaliser=True)

        def together(weights, q, kk, v):
            result = causal_feature_prefix(weights, q, kk, v, valid, head_axes=head_axes, **options)
            return result.out, result.query_bad, result.key_bad

        def apart(weights, q, kk, v):
            def head(n):
                w = weights[n] if head_axes == 0 else weights
                result = causal_feature_prefix(w, q[:, n], kk[:, n], v[:, n], valid, **options)
                return result.out, result.query_bad, result.key_bad

            return jax.tree.map(lambda *a: jnp.stack(a, axis=1), *map(head, range(heads)))

        @jax.jit
        def both(weights, q, kk, v, g):
            results = []
            for op in (together, apart):
                (out, query_bad, key_bad), pullback = jax.vjp(op, weights, q, kk, v)
                flags = [np.zeros(f.shape, jax.dtypes.float0) for f in (query_bad, key_bad)]
                results.append((out, query_bad, key_bad, pullback((g, *flags))))
            return results

        (out, query_bad, key_bad, grads), (out1, query_bad1, key_bad1, grads1) = both(
            weights, q, kk, v, g
        )
    np.testing.assert_array_equal(query_bad, query_bad1)
    np.testing.assert_array_equal(key_bad, key_bad1)
    assert query_bad[30, 2] and key_bad[9, 1] and query_bad.sum() == 1 and key_bad.sum() == 1
    np.testing.assert_allclose(out, out1, rtol=1e-12, atol=1e-12)
    for a, b in zip(grads, grads1, strict=True):
        assert np.all(np.isfinite(a))
        np.testing.assert_allclose(a, b, rtol=1e-11, atol=1e-11 * np.abs(b).max())


def test_head_axes_need_rows_with_a_heads_axis():
    rows = jnp.zeros((8, 4))
    with pytest.raises(ValueError, match="head_axes"):
        causal_feature_prefix(
            None,
            rows,
            rows,
            rows,
            jnp.ones(8, bool),
            log_features=identity_logs,
            chunk=4,
            head_axes=0,
        )


def test_the_initial_state_cotangent_leaves_out_the_padded_rows():
    """``initial_state_cotangent`` of T = 13 rows in chunks of 4 (3 padded rows) with earlier
    keys' shifts c_0 = 100 in float32: a padded row (la = 0, G = 0) has M = inf, so its
    factor exp(la + c_0 - M) is 0; with M = 0 it was exp(100) = inf and inf * 0 = NaN. The
    rows' own exponents la + c_0 - M <= -1, as the float64 direct sum."""
    la, _, _, g = (np.asarray(x) for x in operands(5))
    initial_shift = np.full(WIDTH, 100.0)
    row_shift = np.max(la, axis=1) + 101.0
    args = (la, row_shift, initial_shift, g)
    got = initial_state_cotangent(
        None, *(jnp.asarray(x, jnp.float32) for x in args), log_features=identity_logs, chunk=4
    )
    want = np.exp(la + initial_shift - row_shift[:, None]).T @ g
    assert np.all(np.isfinite(np.asarray(got)))
    # Each exponent (|la|, M up to ~400) is rounded with error ~4 eps32 * 400, as above.
    tolerance = 4 * float(np.finfo(np.float32).eps) * 400 * np.abs(want).max()
    np.testing.assert_allclose(got, want, rtol=0, atol=tolerance)


@pytest.mark.parametrize(
    ("schedule", "chunk"), schedules_and_chunks([3], {("batched", 3)}), indirect=["schedule"]
)
def test_row_shifts_cover_earlier_keys_above_every_key_of_the_sequence(chunk, schedule):
    """An initial state whose shift c_0 lies above every key of the sequence (a sequence-
    parallel shard after a device with larger keys): the running maxima start at c_0 in every
    chunk, so each row shift is at least la_t + c_0 (the batched schedule's key pass took the
    maxima of the chunks' keys alone, and the later chunks' rows read the state with factors
    e^5 above their row's largest term), and the values equal the direct float64 sums."""
    la, lb, v, _ = operands(6)
    with jax.enable_x64(True):
        initial_shift = jnp.max(lb, axis=0) + 5.0
        state = jnp.ones((WIDTH, VALUES), jnp.float64)

        @jax.jit  # one program (this schedule's: traced here)
        def prefix(la, lb, v):
            valid = jnp.ones(LENGTH, bool)
            return causal_feature_prefix(
                None,
                la,
                lb,
                v,
                valid,
                log_features=identity_logs,
                chunk=chunk,
                initial=(state, initial_shift),
            )

        result = prefix(la, lb, v)
        row_shift = result.row_shift
        assert np.all(np.asarray(row_shift) >= np.max(la + initial_shift, axis=1))
        earlier = jnp.exp(la + initial_shift - row_shift[:, None]) @ state
        want = causal_log_prefix_quadratic(la, lb, v, row_shift) + earlier
    np.testing.assert_allclose(result.out, want, rtol=1e-12, atol=1e-12 * np.abs(want).max())


def test_low_precision_rows_accumulate_in_float32():
    """bfloat16 log-features and values: the outputs, row shifts and sums are float32 (the
    op's accumulation dtype is float32 at least), equal to the op on the same values in
    float32 to float32's rounding of exponents of size ~800 (as above)."""
    la, lb, v, _ = operands(1)
    low = [jnp.asarray(x, jnp.bfloat16) for x in (la, lb, v)]
    prefix = jax.jit(lambda *x: causal_log_prefix(*x, 4))
    out, shift = prefix(*low)
    assert out.dtype == shift.dtype == jnp.float32
    want, want_shift = prefix(*(x.astype(jnp.float32) for x in low))
    np.testing.assert_array_equal(shift, want_shift)
    tolerance = 4 * float(np.finfo(np.float32).eps) * 1000 * np.abs(want).max()
    np.testing.assert_allclose(out, want, rtol=0, atol=tolerance)
