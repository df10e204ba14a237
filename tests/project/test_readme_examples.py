"""Every Python block of the README and the docs pages runs, each in a process of its own (one
block sets JAX's compilation cache for its process), from a folder of its own.

A block may use names the README leaves to the reader: ``CONTEXT`` gives them (sizes, targets,
a file of rows) and makes ``jax.distributed.initialize()`` a no-op, so that the multi-host block
runs as one process; the cache block's placeholder path is replaced by a temporary folder.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from tests.support import ROOT

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]

CONTEXT = """\
import jax
import numpy as np
from rfjax import features, linear_models, projections

jax.distributed.initialize = lambda *args, **kwargs: None  # one process stands for the cluster
d, m, lengthscale = 8, 32, 1.5
y = np.random.default_rng(0).normal(size=100)
np.save("rows_of_this_host.npy", np.random.default_rng(1).normal(size=(100, d)))
"""


def _python_blocks() -> list[tuple[str, str]]:
    blocks = []
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        for match in re.finditer(r"```python\n(.*?)```", text, flags=re.S):
            line = text.count("\n", 0, match.start()) + 1
            blocks.append((f"{page.relative_to(ROOT)}:{line}", match.group(1)))
    return blocks


BLOCKS = _python_blocks()


def test_the_blocks_are_found():
    # The README's taste of the API, its compilation cache and its multi-host ridge regression.
    assert len([b for b in BLOCKS if b[0].startswith("README.md:")]) >= 3, BLOCKS


@pytest.mark.integration
@pytest.mark.parametrize(("where", "block"), BLOCKS, ids=[where for where, _ in BLOCKS])
def test_python_block_runs(where, block, tmp_path):
    source = CONTEXT + block.replace("/path/to/jax_cache", str(tmp_path / "jax_cache"))
    completed = subprocess.run(
        [sys.executable, "-c", source],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert completed.returncode == 0, f"{where}:\n{completed.stderr[-3000:]}"
