"""Every notebook's exercises have hints and solutions; the solutions that run on a CPU do run (fast)."""
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SOLUTIONS = REPO / "docs" / "solutions"
NOTEBOOKS = sorted((REPO / "notebooks").glob("*.ipynb"))


def _exercise_count(path: Path) -> int:
    last = "".join(json.loads(path.read_text())["cells"][-1]["source"])
    return len(re.findall(r"^\d+\. ", last.split("## Exercises", 1)[-1], re.M))


def _blocks(path: Path) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", path.read_text(), re.S | re.M)


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.name)
def test_every_exercise_has_a_hint_and_a_solution(notebook):
    path = SOLUTIONS / notebook.with_suffix(".md").name
    assert path.exists(), f"no hints and solutions for {notebook.name} in docs/solutions/"
    text = path.read_text()
    headings = re.findall(r"^## (\d+)\. ", text, re.M)
    assert headings == [str(i) for i in range(1, _exercise_count(notebook) + 1)], \
        f"{path.name}: one '## N.' section per exercise of {notebook.name}"
    for section in re.split(r"^## \d+\. ", text, flags=re.M)[1:]:
        assert "**Hint.**" in section and ("**Solution.**" in section or "```python" in section), section[:80]
    last = "".join(json.loads(notebook.read_text())["cells"][-1]["source"])
    assert f"docs/solutions/{path.name}" in last, f"{notebook.name}'s exercises do not link to {path.name}"


RUNNABLE = [p for p in sorted(SOLUTIONS.glob("0*.md")) if _blocks(p)]


@pytest.mark.parametrize("path", RUNNABLE, ids=lambda p: p.name)
def test_cpu_solutions_run(path, tmp_path):
    script = "\n\n".join(_blocks(path))
    env = {**os.environ, "PYTHONPATH": str(REPO), "LABKIT_MODE": "cpu", "HF_HUB_OFFLINE": "1", "MPLBACKEND": "Agg"}
    proc = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, f"{path.name}:\n{proc.stderr[-3000:]}"
    assert proc.stdout.strip(), f"{path.name}: a solution should show its result"
