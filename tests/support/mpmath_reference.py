"""Arbitrary-precision references for the RF-conformity closed forms (mpmath), independent of rfjax.

* ``log_conformity_quadrature``: Eq. 21 of the SimRF paper by mpmath's tanh-sinh quadrature,
  with mpmath's own 1F1, the interval split around the integrand's peak (located on a
  log-spaced grid), at 30 significant digits.
* ``log_simplex_series``: Eq. 24, the paper's double series, summed exactly at a working
  precision that covers its cancellation (~(1 + 1/(d-1)) v^2 / ln 10 digits): practical for
  v <= ~4.

Regenerate the stored grid (``data/simplex_conformity_mpmath.json``, used by
``tests/rfjax/theory/test_theory.py``) with ``python tests/support/mpmath_reference.py`` (a few
minutes).

References: Reid et al. 2023, arXiv:2301.13856, Eq. 21 (= Eq. 63), Eq. 24 (= Eq. 67).
"""

from __future__ import annotations

import functools
import json
import math
import pathlib
from collections.abc import Sequence

import mpmath as mp

GRID_PATH = pathlib.Path(__file__).parent / "data" / "simplex_conformity_mpmath.json"
GRID_DIMS = (2, 3, 4, 6, 8, 16, 64, 256, 1024)
GRID_NORMS = (0.0, 0.5, 1.0, 2.0, 3.0, 5.0, 8.0, 12.0, 14.0, 18.0, 20.0, 26.0, 30.0, 40.0)


def log_conformity_quadrature(dim: int, v: float, cos_theta: float, digits: int = 30) -> float:
    """log rho_theta(v) = log E_u[1F1(d; d/2; (v^2/2)(1 + cos(theta) sin u))] by mpmath.quad."""
    with mp.workdps(digits):
        d, c = mp.mpf(dim), mp.mpf(cos_theta)
        half = mp.mpf(v) ** 2 / 2

        def log_integrand(u):
            s = mp.sin(u)
            return (d - 1) * mp.log(s) + mp.log(mp.hyp1f1(d, d / 2, half * (1 + c * s)))

        grid = [mp.pi / 2 * mp.mpf(10) ** (-mp.mpf(k) / 8) for k in range(120)]
        values = [log_integrand(u) for u in grid]
        top = max(range(len(grid)), key=values.__getitem__)
        peak = values[top]
        near = grid[max(0, top - 6) : top + 7]
        points = sorted({mp.mpf(0), mp.pi / 2, *near})

        def integrand(u):
            return mp.exp(log_integrand(u) - peak) if u > 0 else mp.mpf(0)

        integral = mp.quad(integrand, points)
        log_norm = mp.log(mp.sqrt(mp.pi) * mp.gamma(d / 2) / (2 * mp.gamma((d + 1) / 2)))
        return float(mp.log(integral) + peak - log_norm)


@functools.cache
def _inner_sums(dim: int, count: int, digits: int) -> tuple:
    """S_k = sum_{p<=k} (-1/(d-1))^p Gamma((d+p)/2)/Gamma((d+p+1)/2) / (p! (k-p)!), exactly."""
    with mp.workdps(digits):
        d = mp.mpf(dim)
        g = [
            (-1 / (d - 1)) ** p
            * mp.gamma((d + p) / 2)
            / mp.gamma((d + p + 1) / 2)
            / mp.factorial(p)
            for p in range(count)
        ]
        inverse_factorials = [1 / mp.factorial(j) for j in range(count)]
        return tuple(
            mp.fsum(g[p] * inverse_factorials[k - p] for p in range(k + 1)) for k in range(count)
        )


def log_simplex_series(dim: int, norms: Sequence[float]) -> list[float]:
    """log rho_SimRF at each v by Eq. 24, in exact arithmetic (digits enough for cancellation)."""
    v2_max = max(v * v for v in norms)
    count = math.ceil(4 * math.e * v2_max) + 80
    digits = math.ceil((1 + 1 / (dim - 1)) * v2_max / math.log(10)) + 40
    inner = _inner_sums(dim, count, digits)
    values = []
    with mp.workdps(digits):
        d = mp.mpf(dim)
        outer = [mp.gamma(k + d) / mp.gamma(k + d / 2) * inner[k] for k in range(count)]
        prefactor = mp.sqrt(mp.pi) / (mp.gamma(d / 2) * 2 ** (d - 1))
        for v in norms:
            half = mp.mpf(v) ** 2 / 2
            total = prefactor * mp.fsum(outer[k] * half**k for k in range(count))
            values.append(float(mp.log(total)))
    return values


def main() -> None:
    """Writes log rho_SimRF on the (d, v) grid by quadrature, as JSON rows [d, v, log rho]."""
    rows = [
        [dim, v, log_conformity_quadrature(dim, v, -1.0 / (dim - 1))]
        for dim in GRID_DIMS
        for v in GRID_NORMS
    ]
    lines = ",\n".join(json.dumps(row) for row in rows)
    GRID_PATH.parent.mkdir(exist_ok=True)
    GRID_PATH.write_text(f'{{"columns": ["dim", "v", "log_rho"], "rows": [\n{lines}\n]}}\n')


if __name__ == "__main__":
    main()
