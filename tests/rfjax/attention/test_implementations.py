"""Tests of ``rfjax.attention._implementations``: the table of FAVOR attention implementations,
``"auto"``'s choice from measured runs only (checked against the committed GPU run), the fall
back to the XLA form where the measured kernels do not take a call, and the errors for unknown
names and platforms."""

import json
import re

import jax
import jax.numpy as jnp
import pytest

from rfjax import attention
from rfjax.attention import _implementations
from tests.support import ROOT
from tests.support.interpret_mode import interpret_mode_case

GPU_RUN = ROOT / "benchmarks/gpu_runs/2026-11-30-h200/run2/attention_gpu.json"
# The benchmark's method of each implementation (its rows' "method").
METHODS = {"xla": "favor", "pallas_triton": "favor_pallas"}


def test_auto_is_the_measured_choice_on_sm90_and_the_xla_form_elsewhere(monkeypatch):
    choice = _implementations.auto_choice
    sm90 = dict(dtype="bfloat16", capability=(9, 0))
    assert choice("gpu", causal=False, **sm90) == "pallas_triton"
    assert choice("gpu", causal=True, **sm90) == "xla"  # measured slower
    assert choice("gpu", causal=False, dtype="float32", capability=(9, 0)) == "xla"  # unmeasured
    assert choice("gpu", causal=False, dtype="bfloat16", capability=(8, 0)) == "xla"
    assert choice("gpu", causal=False, dtype="bfloat16", capability=None) == "xla"
    assert choice("cpu", causal=False, dtype="bfloat16") == "xla"
    monkeypatch.setitem(_implementations.AUTO, ("tpu", "causal", "float32"), "pallas_tpu")
    assert choice("tpu", causal=True, dtype="float32") == "pallas_tpu"
    assert choice("tpu", causal=False, dtype="float32") == "xla"  # not measured


def test_every_gpu_entry_of_auto_is_the_faster_in_every_measured_row():
    """For each (mode, dtype) of the committed H200 run: ``AUTO``'s choice (the XLA form where
    it has none) took less time than the other implementation in every row (B, T, pass)."""
    rows = json.loads(GPU_RUN.read_text())["rows"]
    times: dict[tuple, float] = {}
    for row in rows:
        if row.get("method") in METHODS.values() and row.get("median_s"):
            case = (row["mode"], row["dtype"], row["batch"], row["length"], row["pass"])
            times[(*case, row["method"])] = row["median_s"]
    cases = {key[:-1] for key in times}
    assert {(mode, dtype) for mode, dtype, *_ in cases} >= {
        (mode, dtype) for platform, mode, dtype in _implementations.AUTO if platform == "gpu"
    }
    for case in sorted(cases):
        mode, dtype = case[:2]
        chosen = _implementations.AUTO.get(("gpu", mode, dtype), "xla")
        other = "xla" if chosen != "xla" else "pallas_triton"
        if (*case, METHODS[other]) in times:
            assert times[(*case, METHODS[chosen])] < times[(*case, METHODS[other])], case


def _operands(dtype=jnp.float32):
    keys = jax.random.split(jax.random.key(0), 4)
    q, k, v = (jax.random.normal(key, (1, 40, 2, 8), dtype) for key in keys[:3])
    return q, k, v, attention.draw_projection(keys[3], 8, 16, coupling="orthogonal")


@pytest.mark.parametrize(
    ("feature_map", "options", "fused"),
    [
        interpret_mode_case("positive", {}, True),  # the kernels in interpret mode
        ("positive", {"causal": True}, False),  # no entry for causal calls
        ("positive", {"stabilize": False}, False),  # the kernels always stabilise
        ("trigonometric", {}, False),  # a map the kernels do not fuse
    ],
)
def test_auto_runs_the_measured_kernels_where_they_take_the_call(
    feature_map, options, fused, monkeypatch
):
    """With a measured entry for this CPU (bidirectional float32: the kernels in interpret
    mode), ``"auto"`` runs the kernels (a Pallas call in the program) and gives their result;
    where the entry does not apply it runs the XLA form, without an error."""
    monkeypatch.setitem(
        _implementations.AUTO, ("cpu", "bidirectional", "float32"), "pallas_triton_interpret"
    )
    q, k, v, projection = _operands()

    def run(implementation):
        return attention.favor_attention(
            q, k, v, projection, feature_map=feature_map, implementation=implementation, **options
        )

    program = str(jax.make_jaxpr(lambda: run("auto"))())
    assert ("pallas_call" in program) == fused
    want = run("pallas_triton_interpret" if fused else "xla")
    assert jnp.array_equal(run("auto"), want)


@pytest.mark.parametrize(
    ("projection_dtype", "fused"),
    [(jnp.float32, True), (jnp.float64, False)],  # a float64 projection computes in float64
)
def test_auto_reads_its_table_at_the_inputs_dtype(projection_dtype, fused, monkeypatch):
    """``AUTO`` is keyed by the inputs' dtype (the benchmark's rows' ``"dtype"``): bfloat16
    inputs, whose compute dtype is float32, take a bfloat16 entry, unless a float64 projection
    makes the call compute in float64, which the kernels do not (traced only: no kernel runs)."""
    monkeypatch.setitem(
        _implementations.AUTO, ("cpu", "bidirectional", "bfloat16"), "pallas_triton_interpret"
    )
    q, k, v, projection = _operands(jnp.bfloat16)
    with jax.enable_x64(projection_dtype == jnp.float64):
        matrix = projection.matrix().astype(projection_dtype)
        program = str(jax.make_jaxpr(lambda: attention.favor_attention(q, k, v, matrix))())
    assert ("pallas_call" in program) == fused


@pytest.mark.parametrize(("head_dim", "fused"), [(64, True), (256, False)])
def test_auto_keeps_the_xla_form_for_heads_its_kernels_do_not_take(head_dim, fused, monkeypatch):
    """Were ``AUTO`` to name the Mosaic GPU kernels, a call with heads wider than they take
    (``_fused_mosaic_gpu.FITTING_WIDTHS``) would run the XLA form, not raise their error
    (traced only: no kernel runs)."""
    monkeypatch.setitem(
        _implementations.AUTO, ("cpu", "bidirectional", "bfloat16"), "pallas_mosaic_gpu_interpret"
    )
    keys = jax.random.split(jax.random.key(0), 4)
    q, k, v = (jax.random.normal(key, (1, 64, 1, head_dim), jnp.bfloat16) for key in keys[:3])
    projection = attention.draw_projection(keys[3], head_dim, 64, coupling="orthogonal")
    program = str(jax.make_jaxpr(lambda: attention.favor_attention(q, k, v, projection))())
    assert ("wgmma" in program) == fused  # Mosaic GPU's interpreter traces the kernels' MMAs


def test_auto_runs_the_xla_form_with_a_sequence_axis(monkeypatch):
    """Under ``sequence_axis`` each device holds a part of the sequence and only the XLA form
    combines the parts; ``"auto"`` keeps it there even where it would pick the kernels (one
    device's mesh, traced only)."""
    monkeypatch.setitem(
        _implementations.AUTO, ("cpu", "bidirectional", "float32"), "pallas_triton_interpret"
    )
    mesh = jax.make_mesh((1,), ("seq",))
    split = jax.sharding.PartitionSpec(None, "seq")
    *rows, projection = _operands()
    q, k, v = (jax.device_put(x, jax.sharding.NamedSharding(mesh, split)) for x in rows)

    def local(q, k, v):
        return attention.favor_attention(q, k, v, projection, sequence_axis="seq")

    attend = jax.shard_map(local, mesh=mesh, in_specs=split, out_specs=split)
    assert "pallas_call" not in str(jax.make_jaxpr(attend)(q, k, v))


@pytest.mark.parametrize(
    ("implementation", "interpreter"),
    [("pallas_triton_interpret", "True"), ("pallas_tpu_interpret", "InterpretParams")],
)
def test_each_interpret_mode_runs_its_interpreter(implementation, interpreter):
    """``"pallas_tpu_interpret"`` runs the kernels in the TPU's simulator (``InterpretParams``,
    which models its memory and grid), ``"pallas_triton_interpret"`` in Pallas' generic
    interpreter; the outputs agree, so only the traced program tells them apart."""
    q, k, v, projection = _operands()
    program = str(
        jax.make_jaxpr(
            lambda: attention.favor_attention(q, k, v, projection, implementation=implementation)
        )()
    )
    assert set(re.findall(r"interpret=(\w+)", program)) == {interpreter}


def test_every_implementation_but_auto_has_one_entry():
    assert set(_implementations.TABLE) == set(_implementations.IMPLEMENTATIONS) - {"auto"}
    for name, entry in _implementations.TABLE.items():
        if not entry.platforms:  # runs anywhere, this CPU included
            assert _implementations.resolve(name, "cpu") == entry
    assert _implementations.resolve("auto", "gpu") == _implementations.TABLE["xla"]


def test_unknown_names_and_foreign_platforms_are_refused_naming_the_choices():
    with pytest.raises(ValueError, match="implementation must be one of 'auto', 'xla'"):
        _implementations.resolve("pallas", "cpu")
    with pytest.raises(ValueError, match="compiles for gpu, not for platform 'cpu'"):
        _implementations.resolve("pallas_triton", "cpu")
