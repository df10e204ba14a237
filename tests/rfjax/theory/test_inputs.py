"""Tests of rfjax.theory._inputs: the couplings with closed forms and why the others have none."""

from __future__ import annotations

import pytest

from rfjax import theory
from tests.support.theory_points import DIM, PRF_X, PRF_Y

pytestmark = pytest.mark.usefixtures("float64")


def test_simplex_plus_explains_why_it_has_no_closed_form():
    for call in (
        lambda: theory.prf_mse(PRF_X, PRF_Y, 6, coupling="simplex_plus"),
        lambda: theory.conformity("simplex_plus", DIM, 1.0),
    ):
        with pytest.raises(ValueError, match=r"no closed form.*re-optimised for every draw"):
            call()
    assert "re-optimised" in theory.no_closed_form_reason("simplex_plus")
    assert "no closed form" in theory.no_closed_form_reason("halton")
    assert theory.no_closed_form_reason("simplex") == ""
    assert "simplex_plus" not in theory.COUPLINGS
