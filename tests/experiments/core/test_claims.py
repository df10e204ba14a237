"""The claims a config declares (experiments.core.claims): each checked before the run, with
an error naming the claim and the field."""

import ml_collections
import pytest

from configs.common import claim
from experiments.core import claims


def config_with(**declared):
    return ml_collections.ConfigDict({"claims": declared})


def test_declared_claims_are_read_with_their_tests_defaults():
    read = claims.declared(
        config_with(
            order=claim("A above B", "greater"), same=claim("A as B", "equivalent", margin=0.1)
        )
    )
    assert list(read) == ["order", "same"]
    assert read["order"].level == 0.95 and read["same"].level == 0.90  # TOST at 5%
    assert read["same"].margin == 0.1 and read["order"].pooling == "equal"


@pytest.mark.parametrize(
    "entry, message",
    [
        (claim("x", "bigger"), r"config.claims.c: claim test must be one of"),
        (claim("x", "equivalent"), r"config.claims.c: a 'equivalent' claim needs a margin > 0"),
        # With a zero margin these read as plain orderings that nothing could refute.
        (claim("x", "noninferior"), r"a 'noninferior' claim needs a margin > 0"),
        (claim("x", "nonsuperior"), r"a 'nonsuperior' claim needs a margin > 0"),
        (claim("x", "greater", margin=-1.0), "margin must be a number >= 0"),
        (claim("x", "greater", confidence=1.0), r"confidence must be in \(0, 1\)"),
        (claim("x", "within_se", k=0.0), "k must be > 0"),
        (claim("x", "greater", pooling="median"), "pooling must be one of"),
        ({"statement": "x", "test": "greater", "size": 3}, r"fields \['size'\] are not among"),
    ],
)
def test_a_malformed_claim_is_refused_naming_it(entry, message):
    with pytest.raises(ValueError, match=message):
        claims.declared(config_with(c=entry))


def test_a_config_without_claims_or_with_a_non_bool_powered_is_refused():
    with pytest.raises(ValueError, match=r"config\.claims is missing: declare the claims"):
        claims.declared(ml_collections.ConfigDict({"powered": True}))
    with pytest.raises(TypeError, match=r"config\.powered must be a bool"):
        claims.declared(ml_collections.ConfigDict({"claims": {}, "powered": "yes"}))
