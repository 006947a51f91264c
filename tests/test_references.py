"""Every citation of the lab's references resolves: the file exists and so does the anchor it names."""
import json
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# a link target or a path in a code comment; not a link's text ("[docs/references.md](...)")
LINK = re.compile(r"(?<![\[\w/.])(?P<path>(?:\.\./)?(?:docs/)?references\.md)(?:#(?P<anchor>[\w-]+))?")


def slug(heading: str) -> str:
    """GitHub's anchor for a markdown heading: lowercase, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    return {slug(m.group(1)) for m in re.finditer(r"^#{1,6}\s+(.*)$", path.read_text(), re.M)}


def _texts():
    for path in sorted((REPO / "notebooks").glob("*.ipynb")):
        for i, cell in enumerate(json.loads(path.read_text())["cells"]):
            yield f"{path.name} cell {i}", path.parent, "".join(cell["source"])
    for path in [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]:
        yield str(path.relative_to(REPO)), path.parent, path.read_text()


CITATIONS = [(where, base, m.group("path"), m.group("anchor")) for where, base, text in _texts()
             for m in LINK.finditer(text) if "REFERENCES.md" not in m.group(0)]


def test_the_references_exist_and_notebooks_cite_them():
    assert (REPO / "docs/references.md").exists()
    assert sum(where.endswith(".ipynb") or ".ipynb " in where for where, *_ in CITATIONS) >= 5


@pytest.mark.parametrize("where, base, target, anchor", CITATIONS, ids=[f"{c[0]}:{c[3]}" for c in CITATIONS])
def test_each_citation_resolves(where, base, target, anchor):
    # notebook code comments name the file from the repository root; links are relative to the citing file
    path = (base / target) if (base / target).exists() else REPO / target
    assert path.resolve() == (REPO / "docs/references.md").resolve(), f"{where}: {target} is not docs/references.md"
    if where.endswith(".md") and "references.md" in where:
        return
    assert anchor, f"{where}: cite docs/references.md with an anchor (#section)"
    assert anchor in anchors(path), f"{where}: no section #{anchor} in docs/references.md ({sorted(anchors(path))})"


def test_no_notebook_cites_the_old_references_file():
    for where, _, text in _texts():
        if where.endswith(".md") is False or where == "README.md":
            assert "REFERENCES.md" not in text and "`REFERENCES`" not in text, f"{where} still cites REFERENCES"


def test_the_anchor_check_can_fail():
    assert "t4-step-times" in anchors(REPO / "docs/references.md")
    assert "t4-step-time" not in anchors(REPO / "docs/references.md")
    assert slug("Speed and memory claims of other tools") == "speed-and-memory-claims-of-other-tools"
