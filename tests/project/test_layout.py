"""Every module of ``rfjax`` has a test file whose path names it (issue 45 point 6):
``rfjax/<subpackage>/_<module>.py`` is tested in ``tests/rfjax/<subpackage>/test_<module>.py``,
so that a module's tests are found without a grep; registry-wide checks live beside them."""

import pathlib

from tests.support import ROOT


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
        if not test.is_file()
    ]
    assert not missing, "modules without a test file named for them:\n" + "\n".join(missing)


def test_the_rule_names_the_mirrored_path(tmp_path):
    (tmp_path / "rfjax" / "ops").mkdir(parents=True)
    for name in ("__init__.py", "_fwht.py", "public.py"):
        (tmp_path / "rfjax" / "ops" / name).write_text("")
    assert expected_test_files(tmp_path) == {
        "rfjax/ops/_fwht.py": tmp_path / "tests" / "rfjax" / "ops" / "test_fwht.py"
    }
