"""Sequence-parallel FAVOR (``favor_attention(..., sequence_axis=)``, issue 15 part 2): on 4
forced CPU devices, outputs and gradients equal one device's, causal outputs ignore later
devices bit for bit, memory per device scales as T / devices, and ``PerformerAttention`` uses it.

The 4-device measurements run in a process of their own (``sequence_parallel_checks``):
XLA_FLAGS must set the device count before jax is imported, and the rest of the suite runs on
one device.
"""

import doctest

import flax
import jax
import jax.numpy as jnp
import pytest

from rfjax import attention, nn, projections
from rfjax.attention import _favor, _prefix
from rfjax.nn import nnx as rnnx
from tests.support import SUPPORT
from tests.support.multiprocess import run_on_forced_devices

DEVICES = 4
CASES = (
    "bidirectional_positive_mask",
    "causal_positive_mask",
    "causal_positive_large_keys",
    "causal_trigonometric_per_head",
    "causal_derf_asymmetric_mask",
)


def run_on_four_devices() -> dict:
    return run_on_forced_devices([str(SUPPORT / "sequence_parallel_checks.py")], DEVICES)


@pytest.mark.integration
def test_on_four_devices():
    # One test, so that the 4-device process runs once even when pytest-xdist spreads tests.
    measured = run_on_four_devices()

    # Outputs and gradients equal one device's (float32: only summation orders differ). Masks
    # hide NaN keys and inf values, a whole device's keys and a run across a device boundary.
    assert set(measured["cases"]) == set(CASES)
    for case, errors in measured["cases"].items():
        assert set(errors) == {"output", "grad_query", "grad_key", "grad_value"}
        for name, error in errors.items():
            assert error <= 1e-5, (case, name, error)

    # The same on global arrays split over an Explicit axis (favor_attention runs the shard_map
    # itself), with the batch or the heads split over a second axis; an unfitted OPRF is fitted
    # to the whole batch and sequence (with the batch split, fitting each batch shard apart
    # was off by 4.4% relative).
    assert set(measured["global_cases"]) == {f"{case}_batch_over_data" for case in CASES} | {
        "causal_trigonometric_per_head_heads_over_model",
        "bidirectional_oprf_unfitted_mask",
        "bidirectional_oprf_unfitted_heads_over_model",
    }
    for case, errors in measured["global_cases"].items():
        assert set(errors) == {"output", "grad_query", "grad_key", "grad_value"}
        for name, error in errors.items():
            assert error <= 1e-5, (case, name, error)

    # Data parallelism: the batch split over 2 devices, no sequence_axis, the projection
    # replicated: output and gradients equal one program's, the projection's summed over the
    # devices (until 2026-11-28 causal FAVOR's gradients raised inside shard_map).
    for mode, errors in measured["data_parallel"].items():
        assert set(errors) == {"output", "grad_projection", "grad_query", "grad_key", "grad_value"}
        for name, error in errors.items():
            assert error <= 1e-5, (mode, name, error)

    # The same on global arrays split over jax.make_mesh's default Explicit axis, no
    # sequence_axis (causal raised before 2026-12-01): under jax.set_mesh, and eagerly
    # without it; an unfitted OPRF is fitted to the whole batch.
    assert set(measured["data_parallel_global"]) == {
        "causal_positive_batch",
        "bidirectional_oprf_unfitted_batch",
        "causal_positive_heads",
    }
    for case, errors in measured["data_parallel_global"].items():
        assert set(errors) == {"output", "output_eager", "grad_query", "grad_key", "grad_value"}
        for name, error in errors.items():
            assert error <= 1e-5, (case, name, error)

    # Causal: changed output elements per device after the tokens of one device change (with
    # large keys that raise the running key maximum), or after the last device's values become
    # so large that its state overflows (0 times it is NaN: the later states must be selected
    # away, not weighted by 0): none before it, all from it on.
    changed = measured["perturbations"]
    for feature_map in ("positive", "relu", "derf_asymmetric"):
        for change in ("perturb", "overflow"):
            last = changed[f"{feature_map}_{change}_device_{DEVICES - 1}"]
            assert last[: DEVICES - 1] == [0] * (DEVICES - 1) and last[-1] > 0, (
                feature_map,
                change,
                last,
            )
        second = changed[f"{feature_map}_perturb_device_1"]
        assert second[0] == 0 and min(second[1:]) > 0, (feature_map, second)

    # One unmasked NaN key at position 3 of device 1 reaches exactly the rows that attend to it
    # (a NaN in one place poisons no other device's rows), per device, both batch rows.
    quarter = 64 // DEVICES
    assert measured["non_finite_rows"] == {
        "bidirectional": [2 * quarter] * DEVICES,
        "causal": [0, 2 * (quarter - 3), 2 * quarter, 2 * quarter],
    }

    # Memory at T = 4096: each device of the mesh needs what one device needs at T / 4, plus
    # the gathered per-device states and, in the backward pass, their reduce-scatter: (D, m,
    # H_v + 1) floats per head, 0.53 MiB here, 3.2% of the forward's 16.4 MiB and 1.7% of the
    # gradient's 30.5 MiB at T / 4. Bound 1.05x: those states plus ~2% for XLA's scheduling.
    # Regression, issue 15: before the per-key causal gradient's own VJP, its forward was 1.053x
    # (the state sum's chunked copies of the keys' features live while the query features were
    # computed) and its gradient 1.16x (dL/dS_d entered as (T/D, m) and (T/D, H_v + 1) arrays
    # next to the prefix's own, and dL/dS_<d as one (T/D)-long product); with per-feature key
    # shifts (issue 31), before the log-space prefix's own VJP and chunked state sum, 1.063x
    # (1.13x at T = 16384: the state's (T/D, m) cotangent beside the prefix's own).
    # "causal" is FAVOR+ (positive features), whose causal op keeps per-feature key shifts, as
    # "causal_per_feature" (DERF) does; "causal_per_key" (ReLU features) runs the per-key op.
    for mode in ("bidirectional", "causal", "causal_per_key", "causal_per_feature"):
        for name in ("forward", "gradient"):
            memory = measured["memory"][mode][name]
            quarter = memory["one_device_at_length_over_devices"]
            assert memory["per_device"] <= 1.05 * quarter, (mode, name, memory)
            if mode in ("bidirectional", "causal_per_key"):
                assert memory["per_device"] <= 0.4 * memory["one_device"], (mode, name, memory)
    # The per-feature ops form one chunk's (B, B, m) block forms at a time (C = 64, B = 16,
    # m = 128: 2 MiB over the 4 heads in a scan step) whatever T / D is: a working set that
    # splitting the sequence cannot divide, so one device at T / 4 needs 0.39 of one device at
    # T = 4096 (their ratio is checked above, 1.05x).

    # rfjax.nn.PerformerAttention(causal=True, sequence_axis="seq") against the unsplit layer,
    # linen and NNX, in shard_map and on global tokens split over an Explicit axis.
    assert measured["performer"] <= 1e-5
    assert measured["performer_nnx"] <= 1e-5
    assert measured["performer_nnx_global"] <= 1e-5
    assert measured["performer_global"] <= 1e-5


def test_prefix_cotangents_of_initial_and_final_state():
    # One device, the pieces of the sequence-parallel VJP: causal_prefix's custom VJP with an
    # initial state (its cotangent summed chunk by chunk), and prefix_cotangents with the
    # cotangent of the keys' own final state (weighted_outer_sum), against autodiff of the
    # plain scan and of the one-product state; chunk 8 does not divide T = 37 (padding).
    length, chunk, width, values = 37, 8, 6, 3
    keys = jax.random.split(jax.random.key(0), 7)
    a, b = (jax.random.normal(key, (length, width)) for key in keys[:2])
    v, grad = (jax.random.normal(key, (length, values)) for key in keys[2:4])
    alpha = 2.0 * jax.random.normal(keys[4], (length,))
    beta = jax.lax.cummax(alpha) + 0.3
    state, shift = jax.random.normal(keys[5], (width, values)), beta[0] - 0.5
    state_grad = jax.random.normal(keys[6], (width, values))

    def reference(a, b, v, state):
        out = _prefix.causal_prefix_scan(a, b, v, alpha, beta, chunk, (state, shift))
        return out, (b * jnp.exp(alpha - beta[-1])[:, None]).T @ v

    def custom(a, b, v, state):
        return _prefix.causal_prefix(a, b, v, alpha, beta, chunk, (state, shift))

    @jax.jit
    def pairs():
        pullback = jax.vjp(reference, a, b, v, state)[1]
        with_final = pullback((grad, state_grad))
        return (
            (jax.vjp(custom, a, b, v, state)[1](grad), pullback((grad, 0.0 * state_grad))),
            (
                _prefix.prefix_cotangents(
                    a, b, v, alpha, beta, chunk, (state, shift), grad, state_grad
                ),
                with_final[:3],
            ),
            (
                (_prefix.weighted_outer_sum(b, v, alpha - beta[-1], chunk),),
                (reference(a, b, v, state)[1],),
            ),
        )

    for got, want in pairs():
        for g, w in zip(got, want, strict=True):
            assert jnp.max(jnp.abs(g - w)) <= 1e-5 * jnp.max(jnp.abs(w))


def test_sequence_axis_errors():
    q = k = v = jnp.ones((1, 8, 2, 4))
    w = projections.orthogonal(jax.random.key(0), 4, 8)
    with pytest.raises(TypeError, match="sequence_axis"):
        attention.favor_attention(q, k, v, w, sequence_axis=0)
    with pytest.raises(ValueError, match=r"sequence_axis='seq'.*shard_map"):
        attention.favor_attention(q, k, v, w, sequence_axis="seq")
    layer = nn.PerformerAttention(num_heads=2, attention_kind="exact", sequence_axis="seq")
    with pytest.raises(ValueError, match=r"sequence_axis.*performer"):
        layer.init(jax.random.key(0), jnp.ones((1, 8, 8)))
    with pytest.raises(ValueError, match=r"sequence_axis.*performer"):
        rnnx.PerformerAttention(
            2, 8, attention_kind="exact", sequence_axis="seq", rngs=flax.nnx.Rngs(0)
        )
    layer = rnnx.PerformerAttention(
        2, 8, num_features=4, sequence_axis="seq", rngs=flax.nnx.Rngs(0)
    )
    with pytest.raises(ValueError, match=r"sequence_axis='seq'.*sow_weights=True"):
        layer(jnp.ones((1, 8, 8)), sow_weights=True)


def test_docstring_examples_run():
    # favor_attention's examples include a shard_map over a mesh of this process's devices.
    result = doctest.testmod(_favor)
    assert result.attempted > 0 and result.failed == 0
