"""Structural checks of the lab's notebooks, and where they are published (their Colab home): no torch needed.

``python -m scripts.nbcheck notebooks/`` prints every problem and exits 1 if there is one;
``tests/test_notebook_structure.py`` runs the same checks in CI. A lab notebook must

- be named ``NN_lowercase_words.ipynb`` (numbered, read in order), or ``NNb_...`` for a notebook that
  follows ``NN_...`` (``01b_grpo_variants.ipynb``, the advanced half of 01);
- be valid nbformat 4 JSON, with no outputs and no execution counts committed;
- have code cells that parse as Python (IPython magics and shell escapes aside);
- open with a markdown title cell that carries an "Open in Colab" badge for itself at the lab's home, or,
  while the lab has none, the sentence that says so (:data:`NO_HOME`);
- have, second, an install cell that only acts on Colab (``"google.colab" in sys.modules``) and clones the
  home (its ``LABKIT_REPO`` and ``LABKIT_REF`` lines);
- have exactly one cell tagged ``parameters`` (papermill) that sets ``MODE``;
- end with a summary and exercises;
- carry the notebook metadata JupyterLab itself writes (:data:`NOTEBOOK_METADATA`), so that opening it does
  not mark it modified: JupyterLab replaces a differing ``kernelspec`` or ``language_info`` with the
  running kernel's, which makes the notebook "modified" before the learner touched it.
  ``python -m scripts.nbcheck --fix notebooks`` writes it.

The home is ONE setting, ``labkit/data/home.json`` (``{"repo": "OWNER/NAME", "ref": "TAG"}``, or nulls for a copy
that is not published yet): this copy of the lab cannot know where it will be published. ``python -m scripts.colab
--repo OWNER/NAME --ref TAG`` (:func:`set_home`) writes it and, in the same go, every notebook's badge line and
install cell and the README's Colab links; :func:`home_problems` says where they disagree with it.
"""
from __future__ import annotations

import ast
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path

__all__ = ["NOTEBOOK_METADATA", "check_notebook", "check_notebooks", "colab_badge", "code_source", "fix_metadata",
           "Home", "HomeError", "HOME_FILE", "SET_HOME", "NO_HOME", "validate_home", "read_home", "home_of",
           "readme_block", "home_problems", "set_home"]

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


# --------------------------------------------------------------------------- the lab's home (where it is published)

HOME_FILE = Path(__file__).resolve().parents[1] / "labkit" / "data" / "home.json"  # the one setting
SET_HOME = "python -m scripts.colab --repo OWNER/NAME --ref TAG"
NO_HOME = ("**Colab:** this copy of the lab has no published home yet; an instructor sets it with "
           f"`{SET_HOME}`.")
_COLAB = "https://colab.research.google.com/github/{repo}/blob/{ref}/notebooks/{name}"
# The one line of a title cell that the home writes: the badge, or the sentence that there is none.
_HOME_LINE = re.compile(r"^(?:\[!\[Open In Colab\]\(.*|\*\*Colab:\*\* .*)$", re.M)
# The two lines of an install cell that the home writes; what follows the value (a comment) is kept.
_INSTALL_LINE = {key: re.compile(rf"^{key} = (None|\"[^\"]*\")(.*)$", re.M) for key in ("LABKIT_REPO", "LABKIT_REF")}
_README_BLOCK = re.compile(r"<!-- colab-home\b.*?<!-- /colab-home -->", re.S)
_OWNER = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9-]{0,37}[A-Za-z0-9])?$")  # GitHub: letters, digits, inner hyphens
_NAME_PART = re.compile(r"^[A-Za-z0-9._-]{1,100}$")
_REF = re.compile(r"^[A-Za-z0-9_+][A-Za-z0-9._/+-]*$")  # a tag, branch or commit that reads the same in a URL


class HomeError(ValueError):
    """A home that cannot be used, or files the home cannot be written into; the message says what to do."""


@dataclass(frozen=True)
class Home:
    """Where the lab is published: a GitHub repository ``OWNER/NAME`` and a ref (tag or commit); None for neither."""

    repo: str | None = None
    ref: str | None = None

    @property
    def is_set(self) -> bool:
        return self.repo is not None

    def __str__(self) -> str:
        return f"{self.repo} at {self.ref}" if self.is_set else "no published home"

    def colab_url(self, name: str) -> str:
        """Return the Colab address of notebook file ``name`` at this home's ref."""
        return _COLAB.format(repo=self.repo, ref=self.ref, name=name)


def validate_home(repo: str | None, ref: str | None) -> Home:
    """Return ``Home(repo, ref)`` if both can be used, else raise :class:`HomeError` saying what to write instead.

    ``repo`` is ``OWNER/NAME`` as GitHub spells it (not a URL, no ``.git``); ``ref`` a tag or commit name with no
    space and nothing a URL or git would read otherwise. ``(None, None)`` is the unpublished state.
    """
    if repo is None and ref is None:
        return Home()
    if not repo or not ref:
        raise HomeError("give both --repo OWNER/NAME and --ref TAG (the tag learners will get)")
    if "://" in repo or repo.startswith(("github.com", "git@")):
        tail = re.sub(r"^(?:\w+://)?(?:git@)?(?:www\.)?github\.com[/:]", "", repo).removesuffix(".git").strip("/")
        raise HomeError(f"--repo {repo!r} is an address: give the repository as OWNER/NAME ({tail!r}?)")
    owner, slash, name = repo.partition("/")
    if not slash or not _OWNER.match(owner) or not _NAME_PART.match(name) or name in (".", ".."):
        raise HomeError(f"--repo {repo!r} is not OWNER/NAME: a GitHub owner (letters, digits and inner hyphens), "
                        "'/', and a repository name (letters, digits, '.', '_' and '-'), e.g. alice/grpo-lab")
    if name.endswith(".git"):
        raise HomeError(f"--repo {repo!r}: give the name without '.git' ({owner}/{name[:-4]})")
    if any(c.isspace() for c in ref):
        raise HomeError(f"--ref {ref!r} contains a space: a tag or commit name has none (e.g. v0.2.0-class)")
    if (not _REF.match(ref) or ".." in ref or "//" in ref or ref.endswith(("/", ".", ".lock"))):
        raise HomeError(f"--ref {ref!r} is not a tag or commit name: letters, digits and '.', '_', '/', '+', '-', "
                        "not starting with '-', '.' or '/', no '..', not ending in '/', '.' or '.lock' (e.g. v0.2.0-class)")
    return Home(repo, ref)


def _home_file(root: str | Path | None) -> Path:
    return HOME_FILE if root is None else Path(root) / "labkit" / "data" / "home.json"


def read_home(root: str | Path | None = None) -> Home:
    """Return the home recorded in ``root/labkit/data/home.json`` (default: this labkit's), validated."""
    path = _home_file(root)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        return validate_home(data.get("repo"), data.get("ref"))
    except (OSError, ValueError, AttributeError) as exc:
        raise HomeError(f"{path} does not hold a usable home ({exc}): rewrite it with {SET_HOME}") from exc


def home_of(notebook: str | Path) -> Home:
    """Return the home of the lab that holds ``notebook`` (``../labkit/data/home.json``), else this labkit's."""
    root = Path(notebook).resolve().parent.parent
    return read_home(root if _home_file(root).is_file() else None)


def colab_badge(name: str, home: Home | None = None) -> str:
    """Return the title cell's Colab line for notebook file ``name``: its badge at ``home`` (default: this labkit's
    home), or :data:`NO_HOME` while there is none: never a badge that leads nowhere."""
    home = read_home() if home is None else home
    return f"[![Open In Colab]({_BADGE_IMG})]({home.colab_url(name)})" if home.is_set else NO_HOME


def _install_value(value: str | None) -> str:
    return "None" if value is None else f'"{value}"'


def readme_block(home: Home, names: list[str]) -> str:
    """Return the README's Colab block for ``home``: a link per notebook file in ``names``, or :data:`NO_HOME`."""
    lines = ["<!-- colab-home: written by `python -m scripts.colab` from labkit/data/home.json; "
             "run it rather than editing these lines -->"]
    if home.is_set:
        links = " · ".join(f"[{Path(name).stem}]({home.colab_url(name)})" for name in names)
        lines.append(f"**Open in Colab** (release `{home.ref}` of "
                     f"[{home.repo}](https://github.com/{home.repo}/tree/{home.ref})): {links}")
    else:
        lines.append(NO_HOME)
    return "\n".join(lines + ["<!-- /colab-home -->"])


def _text(source, like) -> list[str] | str:
    """``source`` in the shape of ``like`` (nbformat stores a cell as a list of lines or one string)."""
    return source.splitlines(keepends=True) if isinstance(like, list) else source


def _rehome_notebook(nb: dict, home: Home, name: str) -> list[str]:
    """Write ``home`` into notebook ``nb`` (its title's Colab line, its install cell's two lines); return problems."""
    cells = nb.get("cells", [])
    if len(cells) < 2:
        return [f"{name}: no title and install cells"]
    problems = []
    title = _source(cells[0])
    if len(_HOME_LINE.findall(title)) != 1:
        problems.append(f"{name}: the first cell has {len(_HOME_LINE.findall(title))} Colab lines ('[![Open In Colab]"
                        "...' or '**Colab:** ...'), not one")
    else:
        cells[0]["source"] = _text(_HOME_LINE.sub(lambda m: colab_badge(name, home), title), cells[0]["source"])
    install = _source(cells[1])
    for key, value in (("LABKIT_REPO", home.repo), ("LABKIT_REF", home.ref)):
        if len(_INSTALL_LINE[key].findall(install)) != 1:
            problems.append(f"{name}: the install cell has no single '{key} = ...' line")
        else:
            install = _INSTALL_LINE[key].sub(lambda m: f"{key} = {_install_value(value)}{m.group(2)}", install)
    cells[1]["source"] = _text(install, cells[1]["source"])
    return problems


def _home_plan(root: Path, home: Home) -> tuple[dict[Path, str], list[str]]:
    """Return ``({file: its text with home}, problems)`` for the lab at ``root``, writing nothing."""
    texts, problems = {}, []
    if not (root / "notebooks").is_dir() or not _home_file(root).is_file():
        return {}, [f"{root} is not a copy of the lab (no notebooks/ or labkit/data/home.json)"]
    notebooks = sorted((root / "notebooks").glob("*.ipynb"))
    for path in notebooks:
        try:
            nb = json.loads(path.read_text(encoding="utf-8"))
        except ValueError as exc:
            problems.append(f"{path.name}: not valid JSON ({exc})")
            continue
        problems += _rehome_notebook(nb, home, path.name)
        texts[path] = json.dumps(nb, indent=1, ensure_ascii=False) + "\n"  # nbformat's own layout
    readme = root / "README.md"
    text = readme.read_text(encoding="utf-8") if readme.is_file() else ""
    if len(_README_BLOCK.findall(text)) != 1:
        problems.append("README.md has no single '<!-- colab-home ... <!-- /colab-home -->' block")
    else:
        texts[readme] = _README_BLOCK.sub(lambda m: readme_block(home, [p.name for p in notebooks]), text)
    data = {"repo": home.repo, "ref": home.ref,
            "about": f"Where this lab is published (GitHub OWNER/NAME and the tag learners get); null: not yet. "
                     f"Set it with {SET_HOME}, which also rewrites every notebook's badge and install cell and "
                     "the README's Colab links."}
    texts[_home_file(root)] = json.dumps(data, indent=1) + "\n"
    return texts, problems


def home_problems(root: str | Path) -> list[str]:
    """Return where the notebooks and README of the lab at ``root`` disagree with its home (empty: they agree)."""
    root = Path(root)
    try:
        home = read_home(root)
    except HomeError as exc:
        return [str(exc)]
    texts, problems = _home_plan(root, home)
    command = f"python -m scripts.colab --repo {home.repo} --ref {home.ref}" if home.is_set else SET_HOME
    for path, text in texts.items():
        if path != _home_file(root) and path.read_text(encoding="utf-8") != text:
            problems.append(f"{path.relative_to(root)} does not show {home} (labkit/data/home.json): run {command}")
    return problems


def set_home(root: str | Path, home: Home) -> list[Path]:
    """Write ``home`` into the lab at ``root`` (home.json, every notebook's two home cells, the README's block).

    Return the files that changed (none when the home is already written: it is idempotent). Every file is
    planned before any is written: a notebook or README the home cannot be written into raises
    :class:`HomeError` and leaves everything as it was.
    """
    root = Path(root)
    texts, problems = _home_plan(root, home)
    if problems:
        raise HomeError("nothing written: " + "; ".join(problems))
    changed = [path for path, text in texts.items() if path.read_text(encoding="utf-8") != text]
    for path in changed:
        path.write_text(texts[path], encoding="utf-8")
    return changed


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


def check_notebook(path: str | Path, home: Home | None = None) -> list[str]:
    """Return the list of structural problems of one notebook (empty when it is fine).

    Its Colab line and install cell are checked against ``home`` (default: :func:`home_of` the notebook).
    """
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
    try:
        home = home_of(path) if home is None else home
    except HomeError as exc:
        problems.append(str(exc))
        home = None
    cells = nb.get("cells", [])
    if len(cells) < 4:
        return problems + [f"only {len(cells)} cells: a lab notebook has a title, an install cell, parameters and content"]

    ids = [cell.get("id") for cell in cells]
    if nb.get("nbformat_minor", 0) >= 5 and (None in ids or len(set(ids)) < len(ids)):
        missing = [i for i, cell_id in enumerate(ids) if cell_id is None]
        what = f"cells {missing} have no id" if missing else "two cells share an id"
        problems.append(what + " (nbformat 4.5: every cell has its own; JupyterLab adds them, which reads as a change)")
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
    elif home is not None:
        lines = _source(title).splitlines()
        if colab_badge(path.name, home) not in lines:
            problems.append(f"first cell has no 'Open in Colab' line for this notebook at the lab's home ({home}): "
                            f"want the line {colab_badge(path.name, home)!r} ({SET_HOME} writes it)")
        elif not home.is_set and "colab.research.google.com/github/" in _source(title):
            problems.append("first cell links to Colab although the lab has no published home (a dead link)")

    install = cells[1]
    install_src = _source(install)
    if install.get("cell_type") != "code" or "google.colab" not in install_src or "if " not in install_src:
        problems.append("second cell is not an install cell guarded by 'if \"google.colab\" in sys.modules'")
    elif home is not None:
        for key, value in (("LABKIT_REPO", home.repo), ("LABKIT_REF", home.ref)):
            found = [m.group(1) for m in _INSTALL_LINE[key].finditer(install_src)]
            if found != [_install_value(value)]:
                problems.append(f"the install cell's {key} is {found or 'missing'}, not {_install_value(value)} "
                                f"(the lab's home: {home}; {SET_HOME} writes it)")

    tagged = [i for i, c in enumerate(cells) if "parameters" in c.get("metadata", {}).get("tags", [])]
    if len(tagged) != 1:
        problems.append(f"{len(tagged)} cells are tagged 'parameters'; exactly one must be")
    elif not re.search(r"^MODE\s*=", _source(cells[tagged[0]]), re.M):
        problems.append("the parameters cell does not set MODE")

    for key, expected in NOTEBOOK_METADATA.items():
        if nb.get("metadata", {}).get(key) != expected:
            problems.append(f"metadata {key!r} is not what JupyterLab writes ({expected}): it would open as modified; "
                            "run python -m scripts.nbcheck --fix notebooks")

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
