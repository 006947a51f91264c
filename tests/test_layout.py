"""The package's layout, read from its source (AST), so that the layering cannot silently decay.

- concept modules (everything but ``labkit.cli`` and ``labkit.bench``) never import the command line
  or the benchmarks;
- ``labkit.oom`` does not import ``labkit.presets``; ``labkit.memory`` does not import ``labkit.nano``,
  ``labkit.dashboard`` or ``labkit.training``;
- no import cycle anywhere in ``labkit``, counting imports inside functions too;
- no module over 700 lines; every module says what it holds in an ``__all__`` and a docstring;
- no ``except ImportError`` that could hide a real import error.
"""
import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "labkit"
MAX_LINES = 700


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _imports(path: Path) -> set[str]:
    """Return every labkit module ``path`` imports, at any depth (inside functions too)."""
    found = set()
    tree = ast.parse(path.read_text())
    # `if TYPE_CHECKING:` imports exist for annotations only and never run: not a dependency.
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and ast.unparse(node.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING"):
            node.body = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("labkit"))
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("labkit") and node.level == 0:
            found.add(node.module)
            # `from labkit.bench import worker` imports the submodule labkit.bench.worker
            found.update(f"{node.module}.{a.name}" for a in node.names if f"{node.module}.{a.name}" in MODULES)
    # a module imports its package's __init__ too, but that is not a dependency we police
    return {name for name in found if name in MODULES and name != "labkit"}


GRAPH = {name: _imports(path) for name, path in MODULES.items()}


def _is_command_layer(name: str) -> bool:
    return name in ("labkit.cli", "labkit.__main__") or name == "labkit.bench" or name.startswith("labkit.bench.")


def test_the_source_parses_and_every_module_is_seen():
    assert {"labkit.memory", "labkit.cli", "labkit.bench", "labkit.rewards.parse", "labkit.monitor"} <= set(MODULES)


@pytest.mark.parametrize("name", sorted(n for n in MODULES if not _is_command_layer(n)))
def test_concept_modules_never_import_the_command_line_or_the_benchmarks(name):
    bad = sorted(dep for dep in GRAPH[name] if _is_command_layer(dep))
    assert not bad, f"{name} imports {bad}: commands and benchmarks sit on top of the concepts, not under them"


@pytest.mark.parametrize("name, forbidden", [
    ("labkit.oom", {"labkit.presets", "labkit.run"}),
    ("labkit.memory", {"labkit.nano", "labkit.dashboard", "labkit.training", "labkit.monitor"}),
    ("labkit.objective", {"labkit.nano", "labkit.training", "labkit.presets"}),
    ("labkit.rewards.parse", {"labkit.rewards.functions", "labkit.rewards.check"}),
])
def test_named_layering_rules(name, forbidden):
    assert not GRAPH[name] & forbidden, f"{name} imports {sorted(GRAPH[name] & forbidden)}"


def _find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node):
        state[node] = 1
        stack.append(node)
        for dep in sorted(graph.get(node, ())):
            if state.get(dep) == 1:
                return stack[stack.index(dep):] + [dep]
            if dep not in state:
                cycle = visit(dep)
                if cycle:
                    return cycle
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            cycle = visit(node)
            if cycle:
                return cycle
    return None


def test_no_import_cycle_anywhere():
    # A package imports its own submodules (labkit.rewards -> labkit.rewards.parse): not a cycle of concepts.
    graph = {name: {d for d in deps if not d.startswith(name + ".")} for name, deps in GRAPH.items()}
    cycle = _find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_the_cycle_finder_finds_a_cycle():  # the rule above is only as good as this
    assert _find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _find_cycle({"a": {"b"}, "b": set()}) is None


@pytest.mark.parametrize("name", sorted(MODULES))
def test_no_module_over_700_lines(name):
    lines = len(MODULES[name].read_text().splitlines())
    assert lines <= MAX_LINES, f"{name} has {lines} lines; split it by concept (at most {MAX_LINES})"


@pytest.mark.parametrize("name", sorted(n for n in MODULES if n != "labkit.__main__"))
def test_every_module_has_a_docstring_and_an_explicit_all(name):
    tree = ast.parse(MODULES[name].read_text())
    assert ast.get_docstring(tree), f"{name} has no module docstring"
    names = {t.id for node in tree.body if isinstance(node, (ast.Assign, ast.AnnAssign))
             for t in (node.targets if isinstance(node, ast.Assign) else [node.target]) if isinstance(t, ast.Name)}
    assert "__all__" in names, f"{name} has no __all__"


@pytest.mark.parametrize("name", sorted(MODULES))
def test_no_except_import_error_hides_a_real_import_error(name):
    """An optional dependency is caught as ModuleNotFoundError *and* its name checked, or not at all."""
    tree = ast.parse(MODULES[name].read_text())
    for node in ast.walk(tree):
        if not isinstance(node, ast.ExceptHandler) or node.type is None:
            continue
        caught = {n.id for n in ast.walk(node.type) if isinstance(n, ast.Name)}
        if "ImportError" in caught:
            body = ast.unparse(node)
            assert "raise" in body, f"{name} line {node.lineno}: `except ImportError` that never re-raises"
        if "ModuleNotFoundError" in caught:
            body = ast.unparse(node)
            assert ".name" in body and "raise" in body, (
                f"{name} line {node.lineno}: catch ModuleNotFoundError only for the optional module (check exc.name)")
