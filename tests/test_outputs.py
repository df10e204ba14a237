"""Tests of the shared experiment output helpers."""

import pytest

from experiments import outputs


@pytest.fixture
def template_dir(tmp_path, monkeypatch):
    monkeypatch.setattr(outputs, "TEMPLATES", str(tmp_path))
    (tmp_path / "toy.md").write_text("Claim: $claim. Ours: $ours ($$ is literal).\n")
    return tmp_path


def test_render_summary_fills_every_placeholder(template_dir):
    text = outputs.render_summary("toy", claim="SimRF < ORF", ours=0.25)
    assert text == "Claim: SimRF < ORF. Ours: 0.25 ($ is literal).\n"


@pytest.mark.parametrize(
    "values, listed",
    [({"claim": "x"}, "['ours']"), ({"claim": "x", "ours": 1, "extra": 2}, "['extra']")],
)
def test_render_summary_rejects_missing_and_unused_values(template_dir, values, listed):
    with pytest.raises(ValueError, match=listed.replace("[", r"\[").replace("]", r"\]")):
        outputs.render_summary("toy", **values)


def test_render_summary_names_a_missing_template(template_dir):
    with pytest.raises(FileNotFoundError, match="no summary template for experiment 'nope'"):
        outputs.render_summary("nope")
