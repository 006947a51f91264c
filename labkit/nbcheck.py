"""Structural checks of the lab's notebooks: cheap, and runnable without torch.

``python -m labkit.nbcheck notebooks/`` prints every problem and exits 1 if there is one;
``tests/test_notebook_structure.py`` runs the same checks in CI. A lab notebook must

- be named ``NN_lowercase_words.ipynb`` (numbered, read in order), or ``NNb_...`` for a notebook that
  follows ``NN_...`` (``01b_grpo_variants.ipynb``, the advanced half of 01);
- be valid nbformat 4 JSON, with no outputs and no execution counts committed;
- have code cells that parse as Python (IPython magics and shell escapes aside);
- open with a markdown title cell that carries an "Open in Colab" badge for itself;
- have, second, an install cell that only acts on Colab (``"google.colab" in sys.modules``);
- have exactly one cell tagged ``parameters`` (papermill) that sets ``MODE``;
- end with a summary and exercises;
- carry the notebook metadata JupyterLab itself writes (:data:`NOTEBOOK_METADATA`), so that opening it does
  not mark it modified: JupyterLab replaces a differing ``kernelspec`` or ``language_info`` with the
  running kernel's, which makes the notebook "modified" before the learner touched it.
  ``python -m labkit.nbcheck --fix notebooks`` writes it.
"""
from __future__ import annotations

import ast
import json
import re
import sys
from pathlib import Path

__all__ = ["REPO_URL", "COLAB_URL", "NOTEBOOK_METADATA", "check_notebook", "check_notebooks", "colab_badge", "code_source",
           "fix_metadata"]

REPO_URL = "https://github.com/grpo-lab/grpo-lab"
COLAB_URL = "https://colab.research.google.com/github/grpo-lab/grpo-lab/blob/main/notebooks/{name}"
_BADGE_IMG = "https://colab.research.google.com/assets/colab-badge.svg"
_NAME = re.compile(r"^\d{2}[a-z]?_[a-z0-9]+(?:_[a-z0-9]+)*\.ipynb$")

# What JupyterLab 4 writes when the lab's kernel (ipykernel's "python3", Python 3.11 of environment.yml) starts:
# the kernelspec from the kernel's spec, language_info from its kernel_info reply. JupyterLab compares the whole
# of both (the Python version too): any difference marks the notebook modified as soon as it opens.
NOTEBOOK_METADATA = {
    "kernelspec": {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"},
    "language_info": {"codemirror_mode": {"name": "ipython", "version": 3}, "file_extension": ".py",
                      "mimetype": "text/x-python", "name": "python", "nbconvert_exporter": "python",
                      "pygments_lexer": "ipython3", "version": "3.11.7"},
}


def colab_badge(name: str) -> str:
    """Return the markdown of the "Open in Colab" badge for notebook file ``name``."""
    return f"[![Open In Colab]({_BADGE_IMG})]({COLAB_URL.format(name=name)})"


def _source(cell) -> str:
    src = cell.get("source", "")
    return "".join(src) if isinstance(src, list) else src


def code_source(text: str) -> str:
    """Return a code cell's text with IPython-only lines (``%magic``, ``!shell``, ``x?``) blanked."""
    lines = []
    for line in text.splitlines():
        stripped = line.lstrip()
        if stripped.startswith(("%", "!")) or (stripped.endswith("?") and not stripped.startswith("#")):
            indent = line[: len(line) - len(stripped)]
            lines.append(indent + "pass")
        else:
            lines.append(line)
    return "\n".join(lines)


def check_notebook(path: str | Path) -> list[str]:
    """Return the list of structural problems of one notebook (empty when it is fine)."""
    path = Path(path)
    problems: list[str] = []
    if not _NAME.match(path.name):
        problems.append(f"name {path.name!r} is not NN_lowercase_words.ipynb (or NNb_...)")
    try:
        nb = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        return problems + [f"not valid JSON: {exc}"]
    try:
        import nbformat
    except ModuleNotFoundError as exc:  # the structural check runs without the notebook stack too
        if exc.name != "nbformat":
            raise
        if nb.get("nbformat") != 4:
            problems.append("not nbformat 4")
    else:
        try:
            nbformat.validate(nbformat.from_dict(nb))
        except Exception as exc:  # nbformat.ValidationError and friends
            problems.append(f"invalid nbformat: {str(exc).splitlines()[0]}")
    cells = nb.get("cells", [])
    if len(cells) < 4:
        return problems + [f"only {len(cells)} cells: a lab notebook has a title, an install cell, parameters and content"]

    for i, cell in enumerate(cells):
        if cell.get("cell_type") != "code":
            continue
        if cell.get("outputs"):
            problems.append(f"cell {i} has committed outputs (strip them)")
        if cell.get("execution_count") is not None:
            problems.append(f"cell {i} has an execution count (strip outputs)")
        try:
            tree = ast.parse(code_source(_source(cell)))
        except SyntaxError as exc:
            problems.append(f"cell {i} does not parse: {exc.msg} (line {exc.lineno})")
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith("../"):
                problems.append(f"cell {i} uses the path {node.value!r}, relative to the working directory, which is "
                                "not the notebooks folder on Colab: use labkit.lab.results_dir() or data_dir()")

    title = cells[0]
    if title.get("cell_type") != "markdown" or not _source(title).lstrip().startswith("# "):
        problems.append("first cell is not a markdown title ('# ...')")
    elif COLAB_URL.format(name=path.name) not in _source(title) or _BADGE_IMG not in _source(title):
        problems.append("first cell has no 'Open in Colab' badge pointing at this notebook")

    install = cells[1]
    install_src = _source(install)
    if install.get("cell_type") != "code" or "google.colab" not in install_src or "if " not in install_src:
        problems.append("second cell is not an install cell guarded by 'if \"google.colab\" in sys.modules'")

    tagged = [i for i, c in enumerate(cells) if "parameters" in c.get("metadata", {}).get("tags", [])]
    if len(tagged) != 1:
        problems.append(f"{len(tagged)} cells are tagged 'parameters'; exactly one must be")
    elif not re.search(r"^MODE\s*=", _source(cells[tagged[0]]), re.M):
        problems.append("the parameters cell does not set MODE")

    for key, expected in NOTEBOOK_METADATA.items():
        if nb.get("metadata", {}).get(key) != expected:
            problems.append(f"metadata {key!r} is not what JupyterLab writes ({expected}): it would open as modified; "
                            "run python -m labkit.nbcheck --fix notebooks")

    tail = "\n".join(_source(c) for c in cells[-3:] if c.get("cell_type") == "markdown").lower()
    if "summary" not in tail or "exercise" not in tail:
        problems.append("the notebook does not end with a summary and exercises")
    return problems


def check_notebooks(folder: str | Path = "notebooks") -> dict[str, list[str]]:
    """Return ``{notebook name: problems}`` for every notebook in ``folder`` (plus numbering problems)."""
    folder = Path(folder)
    paths = sorted(folder.glob("*.ipynb"))
    report = {p.name: check_notebook(p) for p in paths}
    numbers = [p.name.split("_", 1)[0] for p in paths]  # "01", "01b", "02"...
    for number in {n for n in numbers if numbers.count(n) > 1}:
        for p in paths:
            if p.name.split("_", 1)[0] == number:
                report[p.name].append(f"number {number} is used by more than one notebook")
    return report


def fix_metadata(path: str | Path) -> bool:
    """Give notebook ``path`` the metadata of :data:`NOTEBOOK_METADATA` (other keys kept); return whether it changed."""
    path = Path(path)
    nb = json.loads(path.read_text(encoding="utf-8"))
    metadata = nb.setdefault("metadata", {})
    if all(metadata.get(k) == v for k, v in NOTEBOOK_METADATA.items()):
        return False
    metadata.update(json.loads(json.dumps(NOTEBOOK_METADATA)))
    path.write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")  # nbformat's layout
    return True


def main(argv: list[str] | None = None) -> int:
    args = list(argv if argv is not None else sys.argv[1:])
    if "--fix" in args:
        args.remove("--fix")
        for path in sorted(Path(args[0] if args else "notebooks").glob("*.ipynb")):
            if fix_metadata(path):
                print(f"{path.name}: metadata set to what JupyterLab writes")
    report = check_notebooks(args[0] if args else "notebooks")
    bad = 0
    for name, problems in report.items():
        for problem in problems:
            print(f"{name}: {problem}")
            bad += 1
    print(f"{len(report)} notebooks checked, {bad} problems")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
