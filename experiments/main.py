"""Runs one experiment from a config file.

Usage:
  python -m experiments.main --config=configs/kernel_mse.py [--workdir=workdirs/kernel_mse]
  python -m experiments.main --config=configs/kernel_mse.py:quick
  python -m experiments.main --config=configs/kernel_mse.py:quick,num_draws=50
  python -m experiments.main --config=configs/kernel_mse.py --config.couplings="('gaussian',)"

The config argument after ``:`` is ``[variant][,key=value...]`` (big_vision style): a variant
the config file defines (``quick`` everywhere), then overrides of its fields, dotted for nested
ones (``train.num_train_steps=10``), tuples in brackets (``couplings=(gaussian,simplex)``).
``--config.key=value`` flags override fields too; there a tuple is a quoted Python literal.
Before anything runs, the config is validated: every field must have its default's type and
the experiment's ``validate_config`` checks names and ranges; a bad config stops with a message
that names the field, the value and the accepted syntax.

The config names its experiment (``config.experiment``) and declares the claims its report
judges (``config.claims``, with their tests and margins: ``experiments.core.verdicts``); the
study package ``experiments.<name>`` provides ``validate_config(config)``,
``measure(config, workdir)``, whose records are stored as ``workdir/records.json``, and
``report(records, config, workdir)``,
which writes the summary, tables, figures and verdicts from them (``python -m
experiments.regenerate`` rewrites a report from its records without measuring).
``workdir/status.json`` says whether the run is ``running``, ``done``, ``failed`` or
``interrupted``; when a run does not finish, a ``FAILED`` file explains why and the previous
run's ``summary.md`` (renamed ``summary.previous.md`` when a run starts) no longer looks
current. Training experiments resume from their checkpoints when started again.

Ablations from the command line (``experiments.core.ablation``): a grid over one config field
and seeds, one study run per cell (resumable), and the paired report of two arms with its
verdict:
  python -m experiments.main --config=configs/performer_vit.py:quick \\
      --sweep=model.feature_map=positive,oprf --seeds=0:5 --metric=accuracy_own

Several processes (one per host; see the README's "Scaling out"): add
``--coordinator_address=HOST0:PORT --num_processes=N --process_id=I`` to the same command on
every host (or ``--distributed`` alone where ``jax.distributed.initialize()`` detects the
cluster: Cloud TPU, SLURM, Open MPI, Kubernetes). The workdir must be shared storage; process 0
writes the results.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import shlex
import sys
import traceback

import jax
import ml_collections
from absl import app, flags, logging
from ml_collections import config_flags

from configs.common import locate_field
from experiments.core import ablation, claims, outputs, records, sweep, training_check
from experiments.core import status as run_status
from experiments.core.validate import check_seed_fields, check_types

_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "Experiment config file[:variant][,key=value...].", lock_config=True
)
_WORKDIR = flags.DEFINE_string(
    "workdir", None, "Output directory (default: workdirs/<experiment>)."
)
_DISTRIBUTED = flags.DEFINE_bool(
    "distributed",
    False,
    "Call jax.distributed.initialize() (cluster auto-detection) before running.",
)
_COORDINATOR = flags.DEFINE_string(
    "coordinator_address", None, "host:port of process 0 (multi-process runs)."
)
_NUM_PROCESSES = flags.DEFINE_integer("num_processes", None, "Number of processes.")
_PROCESS_ID = flags.DEFINE_integer("process_id", None, "This process's index in [0, N).")
_SWEEP = flags.DEFINE_string(
    "sweep", None, "An ablation: FIELD=V1,V2,... (one study run per value and seed; see --seeds)."
)
_SEEDS = flags.DEFINE_string("seeds", "0:5", "Ablation seeds: START:STOP or S1,S2,...")
_SEED_FIELD = flags.DEFINE_string(
    "seed_field", None, "The config field an ablation seed sets (default: the study's SEED_FIELD)."
)
_METRIC = flags.DEFINE_string("metric", None, "The study's headline number an ablation compares.")
_COMPARE = flags.DEFINE_list("compare", [], "The two swept values to compare (default: first two).")
_WORKER = flags.DEFINE_string(
    "worker",
    "0/1",
    "I/N: this process measures every N-th sweep cell from I (independent "
    "processes sharing a workdir; one that sees every record reports).",
)
_WORKER_WAIT = flags.DEFINE_float(
    "worker_wait",
    sweep.WAIT_SECONDS,
    "Seconds a worker waits, after its own cells, for the other workers' cells before it "
    "leaves (status 'waiting'); the last to see every record reports.",
)
_TEST = flags.DEFINE_string(
    "test", "greater", "The ablation's declared claim test (second vs first)."
)
_MARGIN = flags.DEFINE_float("margin", 0.0, "The ablation's declared margin.")

FAILED_FILE = "FAILED"
SUMMARY_FILE = "summary.md"
PREVIOUS_SUMMARY_FILE = "summary.previous.md"


def validate_config(config: ml_collections.ConfigDict) -> None:
    """Checks ``config`` before anything runs: the experiment exists, every field has the type
    of its default in ``configs/<experiment>.py``, no ``seeds`` field repeats a seed, its claims
    (and its training check, if any) are declared and well formed, the trainer options
    (``config.train``, and a nested config's, ``config.vit.train``) are valid, and the
    experiment's own ``validate_config`` accepts names and ranges.

    Raises:
      ValueError, TypeError: naming the field, the value and what is accepted.
    """
    name = config.get("experiment")
    if not isinstance(name, str) or not os.path.exists(_package_path(name)):
        raise ValueError(f"config.experiment={name!r} names no study package experiments/<name>/")
    check_types(config, importlib.import_module(f"configs.{name}").get_config())
    check_seed_fields(config)
    claims.declared(config)
    training_check.declared(config)
    if training_check.trainer_sections(config):
        from experiments.core.train import (
            trainer as train,  # here: experiments without training need no Orbax
        )

        train.validate_train_sections(config)  # config.vit.train too
    importlib.import_module(f"experiments.{name}").validate_config(config)


def _package_path(name: str) -> str:
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), name, "__init__.py")


def _start(workdir: str, status: run_status.Status) -> None:
    """Marks ``workdir`` (created if missing) as running: an old ``FAILED`` note goes, and a
    previous run that died without a word (SIGKILL, a lost machine) is named."""
    os.makedirs(workdir, exist_ok=True)
    previous = run_status.read(workdir)
    if previous is not None and previous["state"] == "dead":
        print(f"the previous run in {workdir} died: {previous['dead_because']}", flush=True)
    failed = os.path.join(workdir, FAILED_FILE)
    if os.path.exists(failed):
        os.remove(failed)
    status.set("running")


def _fail(workdir: str, status: run_status.Status, error: BaseException) -> None:
    """Marks ``workdir`` as failed (or interrupted) with the error and how to go on."""
    # SystemExit: the trainer's TrainingInterrupted (SIGINT/SIGTERM after a checkpoint).
    interrupted = isinstance(error, (KeyboardInterrupt, SystemExit))
    state = "interrupted" if interrupted else "failed"
    message = str(error) or type(error).__name__
    status.set(state, error=f"{type(error).__name__}: {message}")
    lines = [
        f"This run {state}: {type(error).__name__}: {message}",
        "Results in this folder are incomplete; summary.md (if any) is not from this run.",
        "Run the same command again: training experiments resume from their checkpoints.",
    ]
    if not interrupted:
        lines += ["", "".join(traceback.format_exception(error)).rstrip()]
    outputs.write_text(os.path.join(workdir, FAILED_FILE), "\n".join(lines) + "\n")


def _wait(status: run_status.Status, pending: sweep.Pending) -> None:
    """This worker leaves a shared sweep with cells of other workers missing: says which."""
    print(f"this worker's cells are done; {pending}", flush=True)
    status.set("waiting", missing=[list(cell) for cell in pending.missing])


def run_experiment(config, workdir: str | None = None, *, command: list[str] | None = None) -> dict:
    """Validates ``config`` and runs ``config.experiment`` with outputs in ``workdir`` (default
    ``workdirs/<name>``); returns its summary.

    ``command``, the command line that reproduces the run, is recorded in
    ``workdir/command.txt`` (for the results page) and ``workdir/status.json``
    (``experiments.core.status``: state, process, host and heartbeat). If the run raises (or is
    interrupted), ``status.json`` and a ``FAILED`` file say so before the error propagates; a
    worker that leaves a shared sweep before every cell has a record marks it ``waiting``, with
    the missing cells, and returns ``{}``, as does a worker that sees every record after another
    one reported them (``sweep.reporting``: exactly one worker reports).

    Raises:
      ValueError, TypeError: for an invalid config (before anything is written).
    """
    validate_config(config)
    name = config.experiment
    workdir = workdir or os.path.join("workdirs", name)
    status = run_status.Status(workdir, command)
    writer = jax.process_index() == 0
    if writer:
        if command is not None:
            outputs.write_text(os.path.join(workdir, "command.txt"), shlex.join(command) + "\n")
        summary = os.path.join(workdir, SUMMARY_FILE)
        # It describes a run that is no longer the latest. (Workers of a shared sweep leave it
        # to the one that reports, which replaces it: one that started after that report
        # would have put it aside, and then removed it.)
        if os.path.exists(summary) and sweep.WORKER[1] == 1:
            os.replace(summary, os.path.join(workdir, PREVIOUS_SUMMARY_FILE))
        _start(workdir, status)
    module = importlib.import_module(f"experiments.{name}")
    with status:
        try:
            try:
                measured = module.measure(config, workdir)
            except sweep.Pending as pending:
                _wait(status, pending)
                return {}
            result = {}
            with sweep.reporting(
                workdir, identity=config.to_json_best_effort(sort_keys=True)
            ) as reporter:
                if reporter:
                    records.write(workdir, measured)
                    result = module.report(measured, config, workdir)
                else:
                    print("every cell is recorded; another worker wrote the report", flush=True)
        except BaseException as error:
            if writer:
                _fail(workdir, status, error)
            raise
        if writer:
            previous = os.path.join(workdir, PREVIOUS_SUMMARY_FILE)
            if os.path.exists(previous):
                os.remove(previous)
        status.set("done")
    return result


def parse_worker(text: str) -> tuple[int, int]:
    """``"I/N"`` -> ``(I, N)`` with 0 <= I < N.

    Raises:
      app.UsageError: for anything else.
    """
    index, _, count = text.partition("/")
    if not (index.isdigit() and count.isdigit() and int(index) < int(count)):
        raise app.UsageError(f"--worker must be I/N with 0 <= I < N, got {text!r}")
    return int(index), int(count)


def run_ablation(
    config: ml_collections.ConfigDict,
    workdir: str,
    command: list[str] | None = None,
    **arguments,
) -> None:
    """``--sweep``: ``experiments.core.ablation.run(config, workdir, **arguments)`` with the
    ``status.json`` (and ``FAILED`` note) of ``run_experiment``; a worker that leaves before
    every cell has a record marks it ``waiting``."""
    status = run_status.Status(workdir, command)
    writer = jax.process_index() == 0
    if writer:
        _start(workdir, status)
    with status:
        try:
            ablation.run(config, workdir, **arguments)
        except sweep.Pending as pending:
            _wait(status, pending)
            return
        except BaseException as error:
            if writer:
                _fail(workdir, status, error)
            raise
        status.set("done")


def initialize_distributed() -> None:
    """``jax.distributed.initialize`` from the ``--distributed``/``--coordinator_address``/
    ``--num_processes``/``--process_id`` flags (nothing if none is given)."""
    explicit = (_COORDINATOR.value, _NUM_PROCESSES.value, _PROCESS_ID.value)
    if _DISTRIBUTED.value or any(value is not None for value in explicit):
        jax.distributed.initialize(*explicit)


def _stop_on_invalid_config(message: str) -> None:
    print(
        f"invalid config: {message}\nUsage: python -m experiments.main "
        "--config=configs/NAME.py[:variant][,key=value...] (--help for more)",
        file=sys.stderr,
    )
    sys.exit(2)


def parse_flags(argv: list[str]) -> list[str]:
    """absl's flag parsing (``app.run``'s ``flags_parser``), where an invalid config stops with
    the message ``main`` gives for one that fails validation, whichever override form it came
    from: ``--config=FILE:key=value`` (an error of ``get_config``) or ``--config.key=value`` (an
    unknown field: the same message as the first form). Other flag errors read as absl's."""
    try:
        return flags.FLAGS(argv)
    except Exception as error:
        message = _config_error(error, argv)
        if message is not None:
            _stop_on_invalid_config(message)
        if not isinstance(error, flags.Error):
            raise
        print(f"FATAL Flags parsing error: {error}", file=sys.stderr)
        print("Pass --helpshort or --helpfull to see help on flags.", file=sys.stderr)
        sys.exit(1)


def _config_error(error: BaseException, argv: list[str]) -> str | None:
    """The message of the config's own error behind a flag parsing ``error``, if any."""
    if str(error).startswith("flag --config="):
        cause = error  # ml_collections re-raises get_config's error with its traceback as text
        # The chain as a traceback shows it: an error raised ``from None`` (the config's own
        # message, naming the field) hides the one it replaced (int()'s, naming nothing).
        while (inner := _raised_from(cause)) is not None:
            cause = inner
        if isinstance(cause, (ValueError, TypeError)):
            return str(cause)
    keys = [a[len("--config.") :].split("=", 1)[0] for a in argv[1:] if a.startswith("--config.")]
    config = _config_file(argv) if keys else None
    for key in keys if config is not None else ():
        try:
            locate_field(config, key)
        except ValueError as missing:
            return str(missing)
    return None


def _raised_from(error: BaseException) -> BaseException | None:
    """The error ``error`` was raised from or during, as a traceback shows it (None when it
    was raised ``from None``)."""
    if error.__cause__ is not None:
        return error.__cause__
    return None if error.__suppress_context__ else error.__context__


def _config_file(argv: list[str]) -> ml_collections.ConfigDict | None:
    """The config that ``--config=FILE[:arg]`` names (before ``--config.key`` overrides), or
    None if there is none or it does not load."""
    specs = [a.split("=", 1)[1] for a in argv[1:] if a.startswith("--config=")]
    if not specs:
        return None
    path, _, arg = specs[-1].partition(":")
    try:
        spec = importlib.util.spec_from_file_location("experiment_config", path)
        module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
        spec.loader.exec_module(module)  # type: ignore[union-attr]
        return module.get_config(arg) if arg else module.get_config()
    except Exception:
        return None


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    logging.set_verbosity(logging.WARNING)
    initialize_distributed()
    config = _CONFIG.value
    try:
        validate_config(config)
    except (ValueError, TypeError) as error:
        _stop_on_invalid_config(str(error))
    command = ["python", "-m", "experiments.main", *sys.argv[1:]]
    sweep.WORKER = parse_worker(_WORKER.value)
    sweep.WAIT_SECONDS = _WORKER_WAIT.value
    ablating = bool(_SWEEP.value)
    default = config.experiment + ("_ablation" if ablating else "")
    workdir = _WORKDIR.value or os.path.join("workdirs", default)
    try:
        if ablating:
            if not _METRIC.value:
                raise app.UsageError(
                    "--sweep needs --metric (a key of the study's headline numbers)"
                )
            run_ablation(
                config,
                workdir,
                command,
                sweep_text=str(_SWEEP.value),
                seeds_text=_SEEDS.value,
                metric=_METRIC.value,
                seed_field=_SEED_FIELD.value,
                compare=_COMPARE.value,
                test=_TEST.value,
                margin=_MARGIN.value,
            )
        else:
            run_experiment(config, workdir, command=command)
    except KeyboardInterrupt:
        print("\ninterrupted (Ctrl-C); run the same command again to resume.", file=sys.stderr)
        sys.exit(130)
    if jax.process_index() == 0:
        print(_where(workdir, ablating))


def _where(workdir: str, ablating: bool) -> str:
    """The line that says where a finished run's report went."""
    if ablating:
        report = os.path.join(workdir, ablation.REPORT_FILE)
        where = f"ablation: {report}" if os.path.exists(report) else "no ablation report yet"
        return f"{where}; one run per cell in {workdir}/runs/"
    summary = os.path.join(workdir, SUMMARY_FILE)
    where = f"summary: {summary}" if os.path.exists(summary) else "no summary.md"
    return f"{where}; results in {workdir}/ (status.json says whether the run is done)"


if __name__ == "__main__":
    flags.mark_flag_as_required("config")
    app.run(main, flags_parser=parse_flags)
