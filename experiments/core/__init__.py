"""The experiments' core: statistics (``stats``), the one verdict rule (``verdicts``), the arm x
seed sweep runner (``sweep``), records (``records``), config validation (``validate``) and
outputs (``outputs``). Studies build on it; it imports no study."""
