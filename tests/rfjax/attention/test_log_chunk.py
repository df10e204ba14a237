"""Tests of ``rfjax.attention._log_chunk``: one chunk's output and cotangents (its tame keys,
the keys formed by blocks, the earlier chunks' state, the later queries' state) against the
dense sums they stand for, in float64 and in float32; the blocks formed only inside their
loop; how rare keys formed by blocks are; the factored bound; and ``dot``'s float32
accumulation of bfloat16 operands."""

import functools
import re

import jax
import jax.numpy as jnp
import numpy as np

from rfjax import features, projections
from rfjax.attention import _log_prefix
from rfjax.attention._checks import log_floor
from rfjax.attention._log_chunk import (
    _keys,
    _row_shift,
    chunk_cotangents,
    chunk_factors,
    chunk_output,
    dot,
    factored_bound,
)

BLOCKS, BLOCK, FEATURES, VALUES = 3, 4, 5, 2


def operands():
    """One chunk of 3 blocks of 4 positions: log-features la, lb ``(s, b, m)`` spread over
    ~30 (e^30 is far outside float32's range of ratios but exact in float64), values, the
    earlier chunks' state relative to the chunk's start, the later queries' state relative to
    its end, and a cotangent."""
    k = jax.random.split(jax.random.key(0), 6)
    with jax.enable_x64(True):
        shape = (BLOCKS, BLOCK, FEATURES)
        la = 10.0 * jax.random.normal(k[0], shape, jnp.float64)
        lb = 10.0 * jax.random.normal(k[1], shape, jnp.float64) - 5.0
        v = jax.random.normal(k[2], (BLOCKS, BLOCK, VALUES), jnp.float64)
        start = 10.0 * jax.random.normal(k[3], (FEATURES,), jnp.float64)
        end = jnp.maximum(start, jnp.max(lb, axis=(0, 1)))
        state, later = (jax.random.normal(x, (FEATURES, VALUES), jnp.float64) for x in k[4:6])
        grad = jax.random.normal(k[5], (BLOCKS, BLOCK, VALUES), jnp.float64)
    return la, lb, v, start, end, state, later, grad


def dense_output(la, lb, v, start, state, row_shift):
    """Y_t = sum_{j <= t} sum_i e^(la_ti + lb_ji - M_t) v_j + sum_i e^(la_ti + C^s_i - M_t) S_i
    over the chunk's positions in order, as a (C, C, m) masked sum."""
    rows = BLOCKS * BLOCK
    la, lb, v = la.reshape(rows, -1), lb.reshape(rows, -1), v.reshape(rows, -1)
    shift = row_shift.reshape(rows)
    causal = jnp.tril(jnp.ones((rows, rows), bool))[:, :, None]
    pairs = la[:, None, :] + lb[None, :, :] - shift[:, None, None]
    weights = jnp.sum(jnp.exp(jnp.where(causal, pairs, -jnp.inf)), axis=-1)
    earlier = jnp.exp(la + start - shift[:, None]) @ state
    return (weights @ v + earlier).reshape(BLOCKS, BLOCK, -1)


def test_output_is_the_dense_sum_and_the_row_shift_its_largest_exponent():
    la, lb, v, start, _, state, _, _ = operands()
    with jax.enable_x64(True):

        @jax.jit  # one program
        def outputs(la, lb, v, start, state):
            chunk, row_shift = chunk_factors(la, lb, start)
            got, _ = chunk_output(chunk, v, start, state, jnp.float64)
            return got, dense_output(la, lb, v, start, state, row_shift), row_shift

        got, want, row_shift = outputs(la, lb, v, start, state)
        np.testing.assert_allclose(got, want, rtol=1e-12)
        # M_t: the largest of la_ti + lb_ji (j <= t in the chunk) and la_ti + C^s_i.
        flat_la, flat_lb = la.reshape(-1, FEATURES), lb.reshape(-1, FEATURES)
        for t in range(BLOCKS * BLOCK):
            own = np.max(flat_la[t] + flat_lb[: t + 1])
            # Keys of earlier blocks enter through the block starts, E >= their lb.
            assert row_shift.reshape(-1)[t] >= max(own, np.max(flat_la[t] + start))


def test_the_row_shift_is_its_pairs_largest_exponent_bit_for_bit():
    """M_t from the running maximum of the keys (b m values per block) is the maximum over the
    (b, b, m) pairs la_ti + lb_ji, j <= t, and la_ti + E_i exactly, in float32, with keys left
    out at the log floor (rounding is monotone: fl(a + max_j b_j) = max_j fl(a + b_j))."""
    rng = np.random.default_rng(3)
    shape = (BLOCKS, BLOCK, FEATURES)
    la = (30 * rng.standard_normal(shape)).astype(np.float32)
    lb = (30 * rng.standard_normal(shape)).astype(np.float32)
    lb[0, :2] = log_floor(jnp.float32)  # the first keys are left out
    start = np.full(FEATURES, log_floor(jnp.float32), np.float32)  # no earlier keys
    keys = _keys(jnp.asarray(lb), jnp.asarray(start))
    got = np.asarray(_row_shift(jnp.asarray(la), jnp.asarray(lb), keys))
    block_start = np.asarray(keys.block_start)
    for s in range(BLOCKS):
        for t in range(BLOCK):
            pairs = la[s, t][None, :] + lb[s, : t + 1]  # float32 sums, as the pairs' form
            earlier = la[s, t] + block_start[s]
            assert got[s, t] == max(pairs.max(), earlier.max()), (s, t)


def test_cotangents_are_the_derivatives_of_the_dense_sums():
    """dla, dlb, dv of sum(G * Y) + sum_j sum_i e^(lb_ji - C^e_i) (v_j . R_i): the output's
    pieces and the later queries' state R, with the row shifts held constant."""
    la, lb, v, start, end, state, later, grad = operands()
    with jax.enable_x64(True):

        @jax.jit  # one program
        def cotangents(la, lb, v):
            chunk, row_shift = chunk_factors(la, lb, start)
            got = chunk_cotangents(chunk, v, start, end, state, later, grad, jnp.float64)

            def loss(la, lb, v):
                out = dense_output(la, lb, v, start, state, row_shift)
                later_read = jnp.einsum("sbm,sbp,mp->", jnp.exp(lb - end), v, later)
                return jnp.sum(grad * out) + later_read

            return got, jax.grad(loss, argnums=(0, 1, 2))(la, lb, v)

        got, want = cotangents(la, lb, v)
    for a, b in zip(got, want, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-11, atol=1e-11 * np.abs(b).max())


def wild_operands(raised=((1, slice(2, None), 60.0),)):
    """``operands()`` in float32 with the keys of block 1 from position 2 on raised by 60: above
    the chunk's reference (its start and first key) by more than ``factored_bound`` (43.7),
    so those keys are formed by blocks and the others as one product. ``raised``: (block,
    positions, by) of the keys raised."""
    la, lb, v, start, _, state, later, grad = (np.array(x) for x in operands())
    for block, positions, by in raised:
        lb[block, positions] += by
    end = np.maximum(start, np.max(lb, axis=(0, 1)))
    return tuple(np.asarray(x, np.float32) for x in (la, lb, v, start, end, state, later, grad))


def test_keys_far_above_the_chunk_are_formed_by_blocks_and_the_rest_as_one_product():
    """Output and cotangents in float32 with some keys not tame (``wild_operands``) against
    the dense float64 sums with the same row shifts. The exponents reach |la + lb - M| ~ 100,
    each rounded to 2 eps32 of that, so every term carries ~2e-5 relatively at most."""
    operands = wild_operands()
    tame = np.asarray(jax.jit(chunk_factors)(*operands[:2], operands[3])[0].tame.tame)
    assert not tame[1, 2:].any() and tame[0].all() and tame[2].all() and tame[1, :2].all()
    assert_chunk_is_the_dense_sums_in_float32(*operands)


def test_keys_formed_by_blocks_reach_later_blocks_relative_to_their_block_start():
    """Keys not tame in block 0 (raised by 60) read by block 2's rows, whose block start is
    block 1's larger keys (raised by 80): the earlier block's keys enter those rows with the
    factor exp(e_0 - E_2) ~ e^-20 (``Blocks.earlier_block``). In the test above the keys
    formed by blocks are their block's largest, so e_1 = E_2 and that factor is 1: its
    inverse, e^+20, gave the same outputs there."""
    operands = wild_operands(((0, slice(1, None), 60.0), (1, slice(None), 80.0)))
    tame = np.asarray(jax.jit(chunk_factors)(*operands[:2], operands[3])[0].tame.tame)
    assert not tame[:2, 1:].any() and tame[2].all()
    assert_chunk_is_the_dense_sums_in_float32(*operands)


def test_a_later_keys_overflowing_product_never_meets_its_zero_weight_in_the_blocks():
    """Keys formed by blocks (``wild_operands``: block 1 from position 2 on): row (1, 2)'s
    cotangent G of 1e30 and the later key (1, 3)'s value of 1e30 make G_t . v_j = inf in
    float32, which the row does not read (j > t): its selected product, not 0 * inf = NaN,
    enters the in-block sums, so every cotangent stays finite (as the tame keys' product)."""
    la, lb, v, start, end, state, later, grad = wild_operands()
    v[1, 3] = 1e30
    grad[1, 2] = 1e30
    chunk, _ = jax.jit(chunk_factors)(la, lb, start)
    assert not np.asarray(chunk.tame.tame)[1, 2:].any()
    got = jax.jit(chunk_cotangents, static_argnums=7)(
        chunk, v, start, end, state, later, grad, jnp.float32
    )
    for cotangent in got:
        assert np.all(np.isfinite(np.asarray(cotangent)))


def assert_chunk_is_the_dense_sums_in_float32(la, lb, v, start, end, state, later, grad):
    chunk, row_shift = jax.jit(chunk_factors)(la, lb, start)
    got_out, _ = jax.jit(chunk_output, static_argnums=4)(chunk, v, start, state, jnp.float32)
    got = jax.jit(chunk_cotangents, static_argnums=7)(
        chunk, v, start, end, state, later, grad, jnp.float32
    )
    with jax.enable_x64(True):
        wide = [jnp.asarray(x, jnp.float64) for x in (la, lb, v, start, end, state, later, grad)]
        la, lb, v, start, end, state, later, grad = wide
        shift = jnp.asarray(row_shift, jnp.float64)
        want_out = dense_output(la, lb, v, start, state, shift)

        def loss(la, lb, v):
            later_read = jnp.einsum("sbm,sbp,mp->", jnp.exp(lb - end), v, later)
            return jnp.sum(grad * dense_output(la, lb, v, start, state, shift)) + later_read

        want = jax.grad(loss, argnums=(0, 1, 2))(la, lb, v)
    relative = 2 * float(np.finfo(np.float32).eps) * 100
    np.testing.assert_allclose(got_out, want_out, rtol=0, atol=relative * np.abs(want_out).max())
    for a, b in zip(got, want, strict=True):
        np.testing.assert_allclose(a, b, rtol=0, atol=relative * np.abs(b).max())


def test_the_chunk_summary_is_the_dense_sum_of_its_keys():
    """``chunk_output``'s summary, sum_j e^(lb_j - C^e) v_j^T over the chunk's keys relative to
    the running maximum at its end: in float64 (every key tame), and in float32 with some keys
    not tame (``wild_operands``, which it forms apart) against the float64 sum. Each exponent
    |lb - C^e| <= ~100 is rounded to 2 eps32 of that, as in the test above."""

    @functools.partial(jax.jit, static_argnums=5)
    def summary(chunk, v, start, state, end, matmul_dtype):
        return chunk_output(chunk, v, start, state, matmul_dtype, end)[1]

    la, lb, v, start, end, state, _, _ = operands()
    with jax.enable_x64(True):
        chunk, _ = jax.jit(chunk_factors)(la, lb, start)
        got = summary(chunk, v, start, state, end, jnp.float64)
        want = jnp.einsum("sbm,sbp->mp", jnp.exp(lb - end), v)
    np.testing.assert_allclose(got, want, rtol=1e-12)
    la, lb, v, start, end, state, _, _ = wild_operands()
    chunk, _ = jax.jit(chunk_factors)(la, lb, start)
    assert not np.asarray(chunk.tame.tame).all()
    got = summary(chunk, v, start, state, end, jnp.float32)
    with jax.enable_x64(True):
        lb, v, end = (jnp.asarray(x, jnp.float64) for x in (lb, v, end))
        want = jnp.einsum("sbm,sbp->mp", jnp.exp(lb - end), v)
    relative = 2 * float(np.finfo(np.float32).eps) * 100
    np.testing.assert_allclose(got, want, rtol=0, atol=relative * np.abs(want).max())


def _computations(hlo: str) -> dict[str, list[str]]:
    """A compiled module's computations by name: their instructions' lines."""
    computations: dict[str, list[str]] = {}
    name = None
    for line in hlo.splitlines():
        header = re.match(r"(?:ENTRY )?%?([\w.-]+) .*\{$", line)
        if header and not line.startswith(" "):
            name = header.group(1)
            computations[name] = []
        elif name is not None and line.startswith(" "):
            computations[name].append(line)
    return computations


def _outside_branch_loops(hlo: str) -> tuple[set[str], set[str]]:
    """(the computations reached from the entry without entering the body of a loop of unknown
    trip count (``_only_if``'s; a scan's has one), those bodies)."""
    computations = _computations(hlo)
    entry = re.search(r"^ENTRY %?([\w.-]+)", hlo, re.M).group(1)
    reached: set[str] = set()
    branches: set[str] = set()
    todo = [entry]
    while todo:
        name = todo.pop()
        if name in reached:
            continue
        reached.add(name)
        for line in computations[name]:
            todo += re.findall(r"(?:calls|condition|to_apply)=%?([\w.-]+)", line)
            body = re.findall(r"body=%?([\w.-]+)", line)
            if "known_trip_count" in line:
                todo += body
            else:
                branches.update(body)
    return reached, branches


def _called(computations: dict[str, list[str]], roots: set[str]) -> set[str]:
    """The computations that ``roots`` call (fusions, loops, reductions), transitively."""
    called: set[str] = set()
    todo = list(roots)
    while todo:
        for line in computations[todo.pop()]:
            for name in re.findall(r"(?:calls|condition|to_apply|body)=%?([\w.-]+)", line):
                if name not in called:
                    called.add(name)
                    todo.append(name)
    return called


def test_the_blocks_are_formed_only_inside_their_loop():
    """In the compiled op and its gradient (a scan over 2 chunks of 3 blocks of 16 positions),
    the keys that are not tame are formed by blocks only inside ``_only_if``'s loop, which
    steps only when some key is not tame: no instruction of the pairs' shape (b, b, m) or of a
    block's products (b, b) is reached from the entry outside it (the tame keys' products are
    (C, C)). XLA hoists a loop's invariant work out of it (into the scan's step), so the blocks'
    operands read ``_only_if``'s zero from the loop's state; without it, this fails."""
    la, lb, v = (np.asarray(x, np.float32).reshape(-1, x.shape[-1]) for x in wild_operands()[:3])
    la, lb, v = (np.concatenate([x] * 8) for x in (la, lb, v))  # 96 positions

    def prefix(la, lb, v):
        return jnp.sum(_log_prefix.causal_log_prefix(la, lb, v, 48)[0])

    hlo = jax.jit(jax.grad(prefix, (0, 1, 2))).lower(la, lb, v).compile().as_text()
    computations = _computations(hlo)
    reached, branches = _outside_branch_loops(hlo)
    blocks_shapes = (f",16,16,{FEATURES}]", "f32[16,16]", ",16,16]")
    assert branches, "no loop of unknown trip count"
    for name in reached:
        for line in computations[name]:
            assert not any(shape in line for shape in blocks_shapes), line
    inside = [line for b in branches for line in computations[b]]
    inside += [line for name in _called(computations, branches) for line in computations[name]]
    assert any(blocks_shapes[0] in line for line in inside)


def _keys_not_tame(norm: float) -> tuple[int, list[int]]:
    """FAVOR+'s key log-features (H = 64, m = 128, an orthogonal projection, T = 1024 keys of
    norm ``norm``, scaled by H^-1/4 as ``favor_attention`` does) chunk by chunk, C = 64: (the
    number of keys not tame, the chunks that hold them)."""
    k = jax.random.split(jax.random.key(5), 2)
    keys = jax.random.normal(k[0], (1024, 64))
    keys = norm * keys / jnp.linalg.norm(keys, axis=1, keepdims=True) / 64**0.25
    positive = features.get("positive")()
    form = positive.affine_log_form(projections.orthogonal(k[1], 64, 128), side="key")
    lb = keys @ form.weights.T + form.bias + form.norm_weight * jnp.sum(keys**2, 1, keepdims=True)
    start = jnp.full((128,), log_floor(jnp.float32))
    count, chunks = 0, []
    for c, chunk in enumerate(lb.reshape(16, 4, 16, 128)):
        wild = int(np.sum(~np.asarray(jax.jit(chunk_factors)(chunk, chunk, start)[0].tame.tame)))
        count += wild
        chunks += [c] * (wild > 0)
        start = jnp.maximum(start, jnp.max(chunk, axis=(0, 1)))
    return count, chunks


def test_keys_not_tame_are_the_exception():
    """At |k| = 4 every key is tame; at 30 only keys of the sequence's first chunk are not (no
    earlier key sets its reference); at 120 some later ones too. A regression that made keys
    by blocks the rule would only show as time."""
    assert _keys_not_tame(4.0) == (0, [])
    count, chunks = _keys_not_tame(30.0)
    assert count > 0 and chunks == [0]
    count, chunks = _keys_not_tame(120.0)
    assert count > 0 and max(chunks) > 0


def test_the_factored_bound_keeps_every_term_that_matters_in_normal_numbers():
    """y <= L / 2 (L = -ln of the smallest normal number): a term of e^(-L/2) or more has its
    other factor at least e^(-L) (normal), and the terms below weigh under the dtype's epsilon
    together; float16 (L / 2 = 4.9) and widths where they would not are refused (-inf); float64
    354; several dtypes take the narrowest."""
    for dtype in (jnp.float32, jnp.bfloat16):
        info = jnp.finfo(dtype)
        bound = factored_bound(256, 16, dtype)
        assert bound == -np.log(float(info.tiny)) / 2  # 43.67
        assert np.float32(np.exp(-2 * bound)) >= info.tiny
        assert np.isfinite(np.float32(np.exp(bound)))
        assert 16 * 256 * np.exp(-bound) <= float(info.eps)
    assert factored_bound(256, 16, jnp.float16) == -np.inf
    assert factored_bound(2**40, 16, jnp.float32) == -np.inf  # 16 m e^(-43.7) > 1.2e-7
    assert abs(factored_bound(256, 16, jnp.float64) - 354.0) < 1.0
    narrowest = factored_bound(256, 16, jnp.float32)
    assert factored_bound(256, 16, jnp.float64, jnp.float32) == narrowest
    assert factored_bound(4, 4, jnp.float16, jnp.float32) == -np.inf


def test_dot_accumulates_bfloat16_operands_in_float32():
    """1 + 2^-7 (exact in bfloat16) summed 256 times is 258 in float32; bfloat16 partial sums
    (spacing 2 from 256 on) would lose the 2^-7 parts."""
    ones = jnp.ones((1, 256), jnp.float32)
    values = jnp.full((256, 1), 1 + 2.0**-7, jnp.float32)  # exact in bfloat16
    got = dot("ik,kj->ij", ones, values, jnp.bfloat16)
    assert got.dtype == jnp.float32
    assert float(got[0, 0]) == 256 * (1 + 2.0**-7)
