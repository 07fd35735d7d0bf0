"""Size counts a maintainer watches: largest file, largest class, longest signature, repeated defaults.

Reads ``src/xrfm_torch`` (or the folder given) with :mod:`ast`; imports nothing::

    python tools/code_counts.py            # this checkout
    git worktree add /tmp/old <commit> && python tools/code_counts.py /tmp/old/src/xrfm_torch

- file: lines of the longest module;
- class: public members defined in a class body (methods, properties, class attributes; names
  without a leading underscore);
- signature: parameters of a function or method (``self``/``cls`` excluded);
- defaults: for each model setting (a kernel's bandwidth, a ``LeafConfig`` field, an ``xRFMTree``
  argument), the places (parameters and dataclass fields) that write its
  default out as a literal (not ``None``; a default read from a constant or a config object is not
  a new definition); a name given a default in more than one place is listed.
"""

from __future__ import annotations

import ast
import sys
from collections import defaultdict
from pathlib import Path


def literal(node: ast.expr | None) -> bool:
    """Whether a default is written out (a constant other than None, or a tuple/list of them)."""
    if isinstance(node, ast.Constant):
        return node.value is not None
    if isinstance(node, ast.UnaryOp):
        return literal(node.operand)
    if isinstance(node, (ast.Tuple, ast.List)):
        return all(literal(e) for e in node.elts)
    return False


def main(root: Path) -> None:
    """Print the counts for the package under ``root``."""
    files, classes, sigs = [], [], []
    settings = {"bandwidth"}  # the kernels' bandwidth, LeafConfig's fields, xRFMTree's arguments
    defaults: dict[str, list[str]] = defaultdict(list)
    for path in sorted(root.rglob("*.py")):
        text = path.read_text()
        rel = path.relative_to(root.parent).as_posix()
        files.append((len(text.splitlines()), rel))
        tree = ast.parse(text)
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef) and node.name == "LeafConfig":
                settings |= {
                    i.target.id
                    for i in node.body
                    if isinstance(i, ast.AnnAssign) and isinstance(i.target, ast.Name)
                }
            if isinstance(node, ast.ClassDef) and node.name == "xRFMTree":
                init = [
                    i for i in node.body if isinstance(i, ast.FunctionDef) and i.name == "__init__"
                ]
                settings |= {a.arg for a in init[0].args.kwonlyargs}
            if isinstance(node, ast.ClassDef):
                public, every = set(), set()
                for item in node.body:
                    if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                        name = item.name
                    elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                        name = item.target.id
                        if literal(item.value) and not name.startswith("_"):
                            defaults[name].append(f"{rel}:{item.lineno}")
                    elif isinstance(item, ast.Assign) and isinstance(item.targets[0], ast.Name):
                        name = item.targets[0].id
                    else:
                        continue
                    every.add(name)
                    if not name.startswith("_"):
                        public.add(name)
                classes.append((len(public), f"{rel}:{node.name} ({len(every)} with private)"))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                a = node.args
                params = [p.arg for p in a.posonlyargs + a.args + a.kwonlyargs]
                params = [p for p in params if p not in ("self", "cls")]
                sigs.append((len(params), f"{rel}:{node.name}"))
                pos = a.posonlyargs + a.args
                pairs = list(zip(pos[len(pos) - len(a.defaults) :], a.defaults))
                pairs += [(p, d) for p, d in zip(a.kwonlyargs, a.kw_defaults) if d is not None]
                for p, d in pairs:
                    if literal(d):
                        defaults[p.arg].append(f"{rel}:{node.lineno}")
    for label, rows in (
        ("file (lines)", files),
        ("class (public members)", classes),
        ("signature (parameters)", sigs),
    ):
        rows.sort(reverse=True)
        print(f"largest {label}: " + ", ".join(f"{n} {w}" for n, w in rows[:3]))
    mine = {k: v for k, v in defaults.items() if k in settings}
    repeated = sorted(((len(v), k) for k, v in mine.items() if len(v) > 1), reverse=True)
    print(
        f"model settings ({len(settings)}): {sum(map(len, mine.values()))} literal defaults; "
        f"{len(repeated)} settings defined in more than one place: "
        + ", ".join(f"{k} {n}" for n, k in repeated)
    )


if __name__ == "__main__":
    main(
        Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).parent.parent / "src/xrfm_torch"
    )
