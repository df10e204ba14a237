"""The tier of the tests that run a Pallas kernel in interpret mode.

rfjax's Pallas kernels (fused FAVOR attention for Triton and Mosaic TPU; fwht for Triton, Mosaic
GPU and Mosaic TPU) compile for GPUs and TPUs only. On a CPU they run in Pallas' interpret mode
(``implementation="<backend>_interpret"``), where JAX's interpreter stands in for the device:
each program takes seconds to lower and compile for a fraction of a second's run. Their
correctness checks run in CI (issue 42: "the kernels' correctness runs in CI in interpret
mode"), in its ``integration`` tier (``.ci/run``: ``--runintegration``), beside the other code
run on forced devices.

The default suite (the README's ``pytest -q -n 2``, for working on the code) checks what runs on
the CPU, and of the kernels what compiles nothing: their lowering for abstract devices, their
argument checks and their tables. Whoever changes a kernel runs its test file with
``--runintegration``.
"""

from __future__ import annotations

from typing import Any

import pytest

INTERPRET_MODE = pytest.mark.integration  # the mark of a test that runs a kernel in interpret mode


def interpret_mode_case(*values: Any) -> Any:
    """A ``parametrize`` case that runs a kernel in interpret mode (CI's tier)."""
    return pytest.param(*values, marks=INTERPRET_MODE)
