"""Experiment config errors print their message alone (exit status 1); the traceback only with
HYDRA_FULL_ERROR=1, as Hydra does for every other error."""

import importlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ctrlg.errors import ExperimentConfigError
from experiments.common import report_errors

ROOT = Path(__file__).resolve().parents[1]
ENTRY_POINTS = ["commongen", "infill", "relm", "runtime", "adapt", "distill"]


def _fails(cfg):
    raise ExperimentConfigError(f"data.limit must be a positive integer, got {cfg}")


def test_a_ctrlg_error_prints_its_message_alone(capsys, monkeypatch):
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    with pytest.raises(SystemExit) as stopped:
        report_errors(_fails)(-1)
    assert stopped.value.code == 1
    err = capsys.readouterr().err
    assert err.splitlines() == ["Error: data.limit must be a positive integer, got -1",
                                "(HYDRA_FULL_ERROR=1 shows the traceback)"]


def test_hydra_full_error_keeps_the_traceback(monkeypatch):
    monkeypatch.setenv("HYDRA_FULL_ERROR", "1")
    with pytest.raises(ExperimentConfigError, match="got -1"):
        report_errors(_fails)(-1)
    with pytest.raises(KeyError):                  # other errors are never hidden
        report_errors(lambda cfg: {}[cfg])("x")


@pytest.mark.parametrize("name", ENTRY_POINTS)
def test_every_entry_point_reports_ctrlg_errors(name):
    main = importlib.import_module(f"experiments.{name}").main
    chain = []
    while hasattr(main, "__wrapped__"):           # hydra.main → report_errors → main
        chain.append(main)
        main = main.__wrapped__
    assert any(f.__code__ is report_errors(_fails).__code__ for f in chain), name


@pytest.mark.parametrize("override, message", [
    ("data.limit=-1", "Error: data.limit must be a positive integer or null (all items), got -1"),
    ("data.path=/no/such/items.jsonl", "Error: data file '/no/such/items.jsonl' does not exist"),
    ("methods=[nope]", "Error: unknown method 'nope'"),
])
def test_commongen_config_errors_from_the_command_line(tmp_path, override, message):
    env = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}
    done = subprocess.run([sys.executable, "-m", "experiments.commongen", override,
                           f"hydra.run.dir={tmp_path}"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    assert done.stderr.startswith(message), done.stderr
    assert "Traceback" not in done.stderr and len(done.stderr.splitlines()) == 2


def test_lm_dtype_names_and_auto():
    import torch

    from ctrlg.kernels.packed_linear import native_bfloat16
    from ctrlg.tasks.config import lm_dtype

    assert lm_dtype("float32") is torch.float32
    assert lm_dtype("bfloat16") is torch.bfloat16
    assert lm_dtype("auto") is (torch.bfloat16 if native_bfloat16() else torch.float32)
    with pytest.raises(ExperimentConfigError, match="model.dtype must be one of .* got 'fp8'"):
        lm_dtype("fp8")
