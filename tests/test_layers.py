"""The package's layers: each imports only layers below it, and no module imports form a cycle."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "xrfm_torch"

#: Lowest first. A module may import its own layer (without cycles) and the layers before it.
LAYERS = [
    "numerics",
    "kernels",
    "leaf",
    "inputs",
    "tree",
    "models",
    "data",
    "estimators",
    "files",
    "search",
    "lit",
    "pipeline",
    "integrations",
]
#: The package's top level (the public re-exports) sits above everything it re-exports.
TOP = {"xrfm_torch", "xrfm_torch.__about__"}


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p) for p in PACKAGE.rglob("*.py")}


def imports(path: Path) -> set[str]:
    """Every ``xrfm_torch`` module that ``path`` imports, anywhere in it (``TYPE_CHECKING`` too)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.split(".")[0] == "xrfm_torch"}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module.split(".")[0] == "xrfm_torch":
                # "from package import module" imports the module (and the package first)
                found.add(node.module)
                found |= {f"{node.module}.{a.name}" for a in node.names} & MODULES
        elif isinstance(node, ast.ImportFrom) and node.level > 0:
            raise AssertionError(f"{path}: relative import; use the absolute module path")
        elif (name := dynamic_import(node)) is not None and name.split(".")[0] == "xrfm_torch":
            found.add(name)  # importlib.import_module("xrfm_torch...") counts as an import
    return found


def dynamic_import(node: ast.AST) -> str | None:
    """The module an ``import_module(...)`` / ``__import__(...)`` call names: its literal
    argument, or ``"?"`` when the argument is computed."""
    if not isinstance(node, ast.Call) or not node.args:
        return None
    func = node.func
    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
    if name not in ("import_module", "__import__"):
        return None
    arg = node.args[0]
    return arg.value if isinstance(arg, ast.Constant) and isinstance(arg.value, str) else "?"


def layer(module: str) -> int:
    if module in TOP:
        return len(LAYERS) if module == "xrfm_torch" else -1
    return LAYERS.index(module.split(".")[1])


def graph() -> dict[str, set[str]]:
    """Module -> the package modules it imports (a package naming its own submodule: no self-edge)."""
    return {(name := module_name(p)): imports(p) - {name} for p in sorted(PACKAGE.rglob("*.py"))}


def test_every_module_belongs_to_a_layer():
    for module in graph():
        assert module in TOP or module.split(".")[1] in LAYERS, f"{module} is in no layer"


def test_no_module_imports_a_layer_above_its_own():
    upward = [
        f"{module} (layer {layer(module)}) imports {target} (layer {layer(target)})"
        for module, targets in graph().items()
        for target in targets
        if module != "xrfm_torch" and target != "xrfm_torch" and layer(target) > layer(module)
    ]
    upward += [
        f"{m} imports the top-level package"
        for m, t in graph().items()
        if m != "xrfm_torch" and "xrfm_torch" in t
    ]
    assert not upward, "\n".join(upward)


def find_cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """A cycle of ``edges`` as a list of nodes (first == last), or ``None``."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in state and (cycle := visit(nxt)) is not None:
                return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(edges):
        if node not in state and (cycle := visit(node)) is not None:
            return cycle
    return None


def test_module_imports_have_no_cycle():
    edges = graph()
    # importing a submodule also runs its package's __init__: count that edge too
    for module in list(edges):
        for target in list(edges[module]):
            parent = target.rpartition(".")[0]
            inside = module == parent or module.startswith(parent + ".")
            if parent != "xrfm_torch" and parent in edges and not inside:
                edges[module].add(parent)
    assert find_cycle(edges) is None, " -> ".join(find_cycle(edges) or [])


@pytest.mark.parametrize(
    ("edges", "cycle"),
    [
        ({"a": {"b"}, "b": {"c"}, "c": {"a"}}, ["a", "b", "c", "a"]),
        ({"a": {"b"}, "b": {"c"}, "c": set()}, None),
    ],
)
def test_the_cycle_finder_finds_planted_cycles(edges, cycle):
    assert find_cycle(edges) == cycle


def test_the_layer_rule_catches_an_upward_import(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from xrfm_torch.tree import xRFMTree\n"
    )
    assert imports(bad) == {"xrfm_torch.tree"}
    assert layer("xrfm_torch.tree") > layer("xrfm_torch.leaf.model")


def test_dynamic_imports_count_and_computed_ones_are_only_the_config_builder(tmp_path):
    planted = tmp_path / "dyn.py"
    planted.write_text(
        "import importlib\nblend = importlib.import_module('xrfm_torch.models.blend')\n"
    )
    assert imports(planted) == {"xrfm_torch.models.blend"}
    computed = sorted(
        module_name(p)
        for p in PACKAGE.rglob("*.py")
        if any(dynamic_import(n) == "?" for n in ast.walk(ast.parse(p.read_text())))
    )
    # building a model from a config imports the allow-listed targets by name (CONFIG_TARGETS)
    assert computed == ["xrfm_torch.numerics.config"]
