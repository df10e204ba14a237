"""Every module of ``rfjax`` has a test file whose path names it (issue 45 point 6):
``rfjax/<subpackage>/_<module>.py`` is tested in ``tests/rfjax/<subpackage>/test_<module>.py``,
so that a module's tests are found without a grep; registry-wide checks live beside them."""

import pathlib

from tests.support import ROOT

# The modules whose test file is still to be written (open work of issue 45 point 6). The list
# only shrinks: a module given its test file must leave it (the last test fails otherwise).
NOT_YET = frozenset(
    {
        "rfjax/attention/_bidirectional.py",
        "rfjax/attention/_causal.py",
        "rfjax/attention/_checks.py",
        "rfjax/attention/_chunks.py",
        "rfjax/attention/_decode.py",
        "rfjax/attention/_fused_kernels.py",
        "rfjax/attention/_global_split.py",
        "rfjax/attention/_head_features.py",
        "rfjax/attention/_implementations.py",
        "rfjax/attention/_per_head.py",
        "rfjax/attention/_prefix.py",
        "rfjax/attention/_reference.py",
        "rfjax/attention/_weights.py",
        "rfjax/data/_fashion_mnist.py",
        "rfjax/data/_fsdd.py",
        "rfjax/data/_ptb.py",
        "rfjax/data/_uci.py",
        "rfjax/features/_clustering.py",
        "rfjax/features/_common.py",
        "rfjax/features/_complex_exponential.py",
        "rfjax/features/_dense_exponential.py",
        "rfjax/features/_fourier.py",
        "rfjax/features/_pointwise.py",
        "rfjax/features/_polynomial.py",
        "rfjax/features/_positive.py",
        "rfjax/features/_registry.py",
        "rfjax/linear_models/_blocks.py",
        "rfjax/linear_models/_model.py",
        "rfjax/linear_models/_solve.py",
        "rfjax/linear_models/_statistics.py",
        "rfjax/linear_models/_transform.py",
        "rfjax/nn/_conformer.py",
        "rfjax/nn/_lstm_lm.py",
        "rfjax/nn/_patch_importance.py",
        "rfjax/nn/_performer_lm.py",
        "rfjax/nn/_vit.py",
        "rfjax/nn/nnx/_vit.py",
        "rfjax/ops/_fwht_mosaic_gpu.py",
        "rfjax/ops/_fwht_tpu.py",
        "rfjax/ops/_fwht_triton.py",
        "rfjax/theory/_bucketing.py",
        "rfjax/theory/_conformity.py",
        "rfjax/theory/_exponential.py",
        "rfjax/theory/_hybrid.py",
        "rfjax/theory/_inputs.py",
        "rfjax/theory/_kernels.py",
        "rfjax/theory/_monte_carlo.py",
        "rfjax/theory/_mse.py",
        "rfjax/theory/_quadrature.py",
        "rfjax/theory/_series.py",
    }
)


def expected_test_files(root: pathlib.Path) -> dict[str, pathlib.Path]:
    """``{module path: the test file that must exist}`` for every private module of rfjax."""
    return {
        str(module.relative_to(root)): root
        / "tests"
        / module.parent.relative_to(root)
        / f"test_{module.stem.removeprefix('_')}.py"
        for module in sorted((root / "rfjax").rglob("_*.py"))
        if module.name != "__init__.py"
    }


def test_every_rfjax_module_has_a_test_file_named_for_it():
    missing = [
        f"{module} -> {test.relative_to(ROOT)}"
        for module, test in expected_test_files(ROOT).items()
        if not test.is_file() and module not in NOT_YET
    ]
    assert not missing, "modules without a test file named for them:\n" + "\n".join(missing)


def test_the_rule_names_the_mirrored_path(tmp_path):
    (tmp_path / "rfjax" / "ops").mkdir(parents=True)
    for name in ("__init__.py", "_fwht.py", "public.py"):
        (tmp_path / "rfjax" / "ops" / name).write_text("")
    assert expected_test_files(tmp_path) == {
        "rfjax/ops/_fwht.py": tmp_path / "tests" / "rfjax" / "ops" / "test_fwht.py"
    }


def test_the_modules_not_yet_tested_exist_and_still_lack_their_file():
    expected = expected_test_files(ROOT)
    stale = [m for m in sorted(NOT_YET) if m not in expected or expected[m].is_file()]
    assert not stale, "remove from NOT_YET (tested or gone):\n" + "\n".join(stale)
