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


# ----------------------------------------------------------------------------- every figure is computed in CI

# A figure: a decimal number, or a number with a unit (GiB, GB, MB, %, k for thousands, B for billions,
# bytes). Inputs are not figures: numbers inside `inline code`, in a heading, or quoted from the exercise itself.
_FIGURE = re.compile(r"(?<![\w.])(?:-?\d[\d,]*\.\d+(?:\s?(?:GiB|GB|MB|%|k\b|B\b|bytes?\b))?"
                     r"|-?\d[\d,]*\s?(?:GiB|GB|MB|%|k\b|B\b|bytes?\b))")


def _sections(path: Path) -> list[tuple[str, str]]:
    """Return ``(heading, body)`` for each ``## N.`` section of a solutions file."""
    parts = re.split(r"^(## \d+\. .*)$", path.read_text(), flags=re.M)
    return list(zip(parts[1::2], parts[2::2]))


def _prose(body: str) -> str:
    body = re.sub(r"^```.*?^```", "", body, flags=re.S | re.M)  # code blocks
    body = re.sub(r"\b(TRL|PEFT|transformers|torch|bitsandbytes) \d+(\.\d+)+", "", body)  # versions
    return re.sub(r"`[^`]*`", "", body)  # inline code: settings and inputs


def _exercise_text(path: Path, number: str) -> str:
    """Return the text of exercise ``number`` in the notebook's last cell."""
    notebook = REPO / "notebooks" / path.with_suffix(".ipynb").name
    last = "".join(json.loads(notebook.read_text())["cells"][-1]["source"]).split("## Exercises", 1)[-1]
    items = re.split(r"^(\d+)\. ", last, flags=re.M)
    return dict(zip(items[1::2], items[2::2])).get(number, "")


def stated_figures_not_computed(path: Path) -> list[str]:
    """Return the figures a solution states in prose that its section's runnable code does not assert."""
    missing = []
    for heading, body in _sections(path):
        exercise = _exercise_text(path, re.match(r"## (\d+)\.", heading).group(1))
        runnable = "\n".join(re.findall(r"^```python\n(.*?)^```", body, flags=re.S | re.M))
        asserted = "\n".join(line for line in runnable.splitlines() if line.strip().startswith("assert"))
        for match in _FIGURE.finditer(_prose(body)):
            figure = match.group(0).strip()
            number = re.match(r"-?[\d,]*\.?\d+", figure).group(0).replace(",", "")
            if number.lstrip("-") in exercise:
                continue  # quoted from the exercise: an input
            if not re.search(rf"(?<![\d.]){re.escape(number.lstrip('-'))}(?![\d])", asserted):
                missing.append(f"{path.name} {heading.strip()}: {figure!r}")
    return missing


@pytest.mark.parametrize("path", sorted(SOLUTIONS.glob("0*.md")), ids=lambda p: p.name)
def test_every_figure_a_solution_states_is_asserted_by_code_that_runs_in_ci(path):
    """A figure in a solution's prose must appear in an assert of that section's runnable code (run above)."""
    assert stated_figures_not_computed(path) == []


def test_the_figure_check_can_fail(tmp_path, monkeypatch):
    notebook = REPO / "notebooks" / "02_reward_functions.ipynb"
    fake = tmp_path / "docs" / "solutions" / "02_reward_functions.md"
    fake.parent.mkdir(parents=True)
    (tmp_path / "notebooks").mkdir()
    (tmp_path / "notebooks" / notebook.name).write_text(notebook.read_text())
    fake.write_text("# x\n\n## 1. y\n**Hint.** h\n\n**Solution.** It wins above 0.875, and saves 2.2 GB.\n")
    monkeypatch.setattr(sys.modules[__name__], "REPO", tmp_path)
    assert len(stated_figures_not_computed(fake)) == 2
    fake.write_text("# x\n\n## 1. y\n**Hint.** h\n\n```python\nassert threshold == 0.875 and round(saved, 1) == 2.2\n```\n"
                    "It wins above 0.875, and saves 2.2 GB.\n")
    assert stated_figures_not_computed(fake) == []
