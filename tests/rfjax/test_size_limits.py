"""No size aborts the interpreter (issue 44): every public constructor of ``rfjax.projections``
and ``rfjax.features`` is called with each of its size arguments at 0, 1, 2^31 and 10^9 (the
others small), in one child process. Each call returns or raises a Python exception, and the
child ends normally, never by a signal (an XLA check failure is SIGABRT). A size that implies an
array past the cap (``rfjax._validation.MAX_ARRAY_BYTES``) or a loop past
``MAX_ITERATIONS`` is a ``ValueError`` before anything compiles.
"""

from __future__ import annotations

import json
import subprocess
import sys

import jax
import pytest

from rfjax import projections
from tests.support import ROOT

SIZES = (0, 1, 2**31, 10**9)

# The child: one line per call, "start" before it (the last one names a call that killed the
# process) and its outcome after. "lazy": a call that allocates nothing whatever the size (a
# dataclass, a feature map whose init draws nothing), which may return for any size.
_CHILD = r"""
import json, sys
import jax, jax.numpy as jnp
from rfjax import features, projections
from rfjax.features import (
    AngularHybridFeatureMap, ClusterHybridFeatureMap, GaussianHybridFeatureMap,
)
from rfjax.projections import DenseMatrices, LowDisplacementRank

key = jax.random.key(0)
points = jnp.linspace(0.0, 1.0, 24).reshape(8, 3)
cases = []  # (label, lazy, call of the size)
for name in projections.available():
    sampler = projections.get(name)
    cases.append((f"{name}(dim=n)", False, lambda n, s=sampler: s(key, n, 4)))
    cases.append((f"{name}(num_features=n)", False, lambda n, s=sampler: s(key, 4, n)))
P = projections
cases += [
    ("simplex_plus(num_sweeps=n)", False, lambda n: P.simplex_plus(key, 4, 4, num_sweeps=n)),
    ("hd_orthogonal(num_rotations=n)", False,
     lambda n: P.hd_orthogonal(key, 4, 4, num_rotations=n)),
    ("fast_simplex(num_rotations=n)", False,
     lambda n: P.fast_simplex(key, 4, 4, num_rotations=n)),
    ("givens(num_layers=n)", False, lambda n: P.givens(key, 4, 4, num_layers=n)),
    ("low_displacement_rank(rank=n)", False, lambda n: P.low_displacement_rank(key, 4, 4, rank=n)),
    ("circulant(dim=n, preprocess)", False, lambda n: P.circulant(key, n, 4, preprocess=True)),
    ("p_model(dim=n, LowDisplacementRank(2))", False,
     lambda n: P.p_model(key, n, 4, generator=LowDisplacementRank(rank=2))),
    ("simplex_directions(n)", False, lambda n: P.simplex_directions(n)),
    ("LowDisplacementRank(rank=n)", True, lambda n: LowDisplacementRank(rank=n)),
    ("DenseMatrices(rows=n)", True, lambda n: DenseMatrices(rows=n, budget_length=4)),
    ("DenseMatrices(budget_length=n)", True, lambda n: DenseMatrices(rows=4, budget_length=n)),
    ("random_offsets(num_features=n)", False, lambda n: features.random_offsets(key, n)),
    ("kmeans(num_clusters=n)", False, lambda n: features.kmeans(key, points, n)),
    ("kmeans(num_iterations=n)", False,
     lambda n: features.kmeans(key, points, 2, num_iterations=n)),
    ("fit_cluster_hybrid(num_query_clusters=n)", False,
     lambda n: features.fit_cluster_hybrid(key, points, points, n, 2)),
    ("fit_cluster_hybrid(num_key_clusters=n)", False,
     lambda n: features.fit_cluster_hybrid(key, points, points, 2, n)),
    ("AngularHybridFeatureMap(num_sign_features=n).init", False,
     lambda n: AngularHybridFeatureMap(num_sign_features=n).init(key, 4)),
    ("GaussianHybridFeatureMap(num_coefficient_features=n).init", False,
     lambda n: GaussianHybridFeatureMap(num_coefficient_features=n).init(key, 4)),
    ("ClusterHybridFeatureMap(num_clusters=n).init", False,
     lambda n: ClusterHybridFeatureMap(num_clusters=n).init(key, 4)),
    ("ClusterHybridFeatureMap(num_iterations=n)", False,
     lambda n: ClusterHybridFeatureMap(num_iterations=n).fit(key, points, points)),
]
for name in features.available():
    unfitted = features.get(name)()
    lazy = unfitted.init(key, 3) is unfitted  # no parameters to draw
    cases.append((f"{name}.init(dim=n)", lazy, lambda n, f=features.get(name): f().init(key, n)))
for label, lazy, call in cases:
    for size in json.loads(sys.argv[1]):
        print(json.dumps({"start": label, "size": size}), flush=True)
        try:
            jax.block_until_ready(call(size))
            outcome = "returned"
        except Exception as error:
            outcome = f"{type(error).__name__}: {str(error)[:300]}"
        line = {"case": label, "lazy": lazy, "size": size, "outcome": outcome}
        print(json.dumps(line), flush=True)
print(json.dumps({"done": len(cases)}), flush=True)
"""


@pytest.fixture(scope="module")
def outcomes():
    """The child's outcomes, after checking that it ended normally."""
    completed = subprocess.run(
        [sys.executable, "-c", _CHILD, json.dumps(SIZES)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    lines = [json.loads(line) for line in completed.stdout.splitlines() if line.startswith("{")]
    last = next((line for line in reversed(lines) if "start" in line), None)
    assert completed.returncode == 0, (
        f"the child ended with {completed.returncode} (a negative code is a signal) in {last}:"
        f"\n{completed.stderr[-3000:]}"
    )
    assert "done" in lines[-1], completed.stderr[-3000:]
    return [line for line in lines if "case" in line]


def test_every_constructor_covers_every_size(outcomes):
    cases = {line["case"] for line in outcomes}
    assert {f"{name}(dim=n)" for name in projections.available()} <= cases
    assert len(outcomes) == len(cases) * len(SIZES)


def test_no_size_aborts_and_every_failure_is_a_value_or_type_error(outcomes):
    # (The child got here: no signal.) Only the argument errors of the library, nothing from
    # XLA (XlaRuntimeError: RESOURCE_EXHAUSTED) or NumPy (MemoryError).
    bad = [o for o in outcomes if o["outcome"].split(":")[0] not in ("returned", "ValueError")]
    assert not bad, bad


@pytest.mark.parametrize("size", [2**31, 10**9])
def test_a_huge_size_is_refused_before_anything_is_drawn(outcomes, size):
    drawn = [o for o in outcomes if o["size"] == size and not o["lazy"]]
    assert drawn and all(o["outcome"].startswith("ValueError") for o in drawn), [
        o for o in drawn if not o["outcome"].startswith("ValueError")
    ]
    # The messages name the argument, the size it implies and the cap.
    sizes = [o for o in drawn if "the cap is 2 GiB" in o["outcome"]]
    assert sizes and all(f"={size}" in o["outcome"] for o in sizes)


def test_a_zero_size_is_refused_or_means_none_where_none_is_allowed(outcomes):
    allowed = {"simplex_plus(num_sweeps=n)", "givens(num_layers=n)", "kmeans(num_iterations=n)"}
    allowed |= {"ClusterHybridFeatureMap(num_iterations=n)"}
    for outcome in outcomes:
        if outcome["size"] == 0 and not outcome["lazy"] and outcome["case"] not in allowed:
            assert outcome["outcome"].startswith("ValueError"), outcome


def test_the_caps_name_the_argument_the_size_and_the_cap():
    from rfjax._validation import check_array_size, check_iterations

    with pytest.raises(ValueError, match=r"dim=1000000000, num_features=4 imply the matrix W"):
        projections.gaussian(jax.random.key(0), 10**9, 4)
    with pytest.raises(ValueError, match=r"rank=1000 must be <= n = 3"):
        projections.low_displacement_rank(jax.random.key(0), 3, 12, rank=1000)
    with pytest.raises(ValueError, match=r"x=3 implies y of shape \(3, 1073741824\)"):
        check_array_size("y", (3, 2**30), "float32", {"x": 3})
    with pytest.raises(ValueError, match=r"num_sweeps=100001 iterations exceeds the cap"):
        check_iterations("num_sweeps", 100_001)
