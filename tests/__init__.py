"""The test suite, laid out as the code it tests (issue 45 point 6):

* ``tests/rfjax/<subpackage>/test_<module>.py``: the library, one file named for each module
  ``rfjax/<subpackage>/_<module>.py`` (``tests/project/test_layout.py`` checks that every module
  has one), beside the registry-wide checks of the subpackage;
* ``tests/experiments/``: the shared experiment code (``core/``), the checks over every study
  and config, the results page; a study's own tests live in its package,
  ``experiments/<study>/test_<study>.py`` (collected too: ``testpaths`` in pyproject.toml);
* ``tests/benchmarks/``: the benchmark scripts' plumbing;
* ``tests/project/``: packaging, CI, colabs, docstring examples, the layers, imports, the layout;
* ``tests/support/``: helpers the tests import (``tests.support.<module>``) and the scripts they
  run in processes of their own.

The folders are packages so that test files in different folders may share a name
(``tests/rfjax/nn/test_attention.py``, ``tests/rfjax/nn/nnx/test_attention.py``). The markers,
the options that run them and ``--cpu-times`` are in the repository root's ``conftest.py``, so
they apply to the study tests under ``experiments/`` too.
"""
