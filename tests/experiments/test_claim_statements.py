"""One source per claim statement: the config declares it (``config.claims``, what
``verdicts.json`` records), a study's ``summary.md`` template takes it from there
(``$config.claims.<name>.statement``) and never writes it out again."""

import functools
import importlib
import pathlib
import re

import pytest

from experiments.core import records, study
from tests.support import ROOT

PLACEHOLDER = re.compile(r"\$\{?config\.claims\.([_a-z][_a-z0-9]*)\.statement\b")


def normalise(text: str) -> str:
    """Lower case, markdown emphasis and code marks dropped, white space collapsed."""
    return " ".join(text.replace("**", "").replace("`", "").lower().split())


def template(name: str) -> str:
    return (ROOT / "experiments" / name / "summary.md").read_text()


@functools.cache
def declared_claims(name: str) -> dict[str, str]:
    """Every claim statement of study ``name`` by claim name, over its default and quick
    variants and the variant of every committed results folder of the study."""
    module = importlib.import_module(f"configs.{name}")
    arguments = {None, "quick"}
    for command in (ROOT / "results").glob("*/command.txt"):
        path, _, argument = records.config_argument(str(command.parent)).partition(":")
        if pathlib.Path(path).stem == name:
            arguments.add(argument or None)
    statements: dict[str, str] = {}
    for argument in arguments:
        for claim, declared in module.get_config(argument).get("claims", {}).items():
            statements.setdefault(claim, declared.statement)
    return statements


def restatements(statement: str, text: str) -> list[str]:
    """The parts of ``statement`` that ``text`` writes out: the whole statement, or its head
    (the words before its first bracket or colon) where that has five words or more."""
    head = re.split(r" \(|:", statement, maxsplit=1)[0]
    parts = [statement] + ([head] if len(head.split()) >= 5 else [])
    return [part for part in parts if normalise(part) in normalise(text)]


def test_restatements_finds_a_statement_or_its_head_through_markdown():
    statement = "The Gram matrix error falls with the number of features (Sec. 5.2, Fig. 7)"
    written = "2. **The Gram matrix error falls with the number of features** (Sec. 5.2): $v."
    assert restatements(statement, written) == [statement.split(" (")[0]]
    assert restatements(statement, "2. **$config.claims.falls.statement**: $v.") == []
    assert restatements("SimRF beats ORF (Fig. 7)", "SimRF beats ORF, as the paper says") == []


@pytest.mark.parametrize("name", study.study_names())
def test_no_claim_statement_is_written_in_the_summary_template(name):
    text = template(name)
    repeated = {
        claim: parts
        for claim, statement in declared_claims(name).items()
        if (parts := restatements(statement, text))
    }
    assert not repeated, (
        f"experiments/{name}/summary.md writes out claim statements of configs/{name}.py "
        f"(use $config.claims.<name>.statement): {repeated}"
    )


@pytest.mark.parametrize("name", study.study_names())
def test_every_claim_placeholder_names_a_declared_claim(name):
    named = set(PLACEHOLDER.findall(template(name)))
    undeclared = sorted(named - set(declared_claims(name)))
    assert not undeclared, (
        f"experiments/{name}/summary.md names claims that configs/{name}.py does not declare: "
        f"{undeclared}"
    )
