"""Every notebook, executed end to end in its small CPU mode (papermill), must finish without error."""
import os
import time
from pathlib import Path

import pytest

NOTEBOOKS = sorted((Path(__file__).resolve().parents[1] / "notebooks").glob("*.ipynb"))


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_runs_in_cpu_mode(path, tmp_path):
    papermill = pytest.importorskip("papermill")
    env_before = dict(os.environ)
    started = time.perf_counter()
    os.environ.update({"LABKIT_MODE": "cpu", "MPLBACKEND": "Agg", "HF_HUB_OFFLINE": "1"})
    try:
        papermill.execute_notebook(
            str(path),
            str(tmp_path / path.name),
            parameters={"MODE": "cpu"},
            cwd=str(path.parent),  # notebooks read results/ and docs/ relative to themselves
            kernel_name="python3",
            progress_bar=False,
            execution_timeout=900,  # per cell; a stuck cell fails instead of hanging CI
        )
    finally:
        os.environ.clear()
        os.environ.update(env_before)
    _record_time(path.name, time.perf_counter() - started)
    # Executed copies are kept under tmp_path; LABKIT_ARTIFACTS keeps them for CI.
    artifacts = os.environ.get("LABKIT_ARTIFACTS")
    if artifacts:
        Path(artifacts).mkdir(parents=True, exist_ok=True)
        (Path(artifacts) / path.name).write_bytes((tmp_path / path.name).read_bytes())


def _record_time(name: str, seconds: float) -> None:
    """With LABKIT_RECORD_TIMES=1, record this notebook's CPU run time in results/notebook_times.json.

    The README's notebook table and each notebook's header state these figures (tests/test_notebook_times.py).
    LABKIT_TIMES_NOTE says on what machine, and how busy it was.
    """
    if os.environ.get("LABKIT_RECORD_TIMES") == "1":
        from labkit.lab import record_notebook_time

        record_notebook_time(name, seconds, note=os.environ.get("LABKIT_TIMES_NOTE", ""))
