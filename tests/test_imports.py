import subprocess
import sys


def test_core_imports_only_torch():
    code = (
        "import sys, xrfm_torch, xrfm_torch.tree, xrfm_torch.leaf;"
        "bad = [m for m in ('lightning', 'hydra', 'torchmetrics', 'sklearn', 'pytorch_lightning') if m in sys.modules];"
        "print(','.join(bad))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def test_the_library_uses_no_private_torch_api():
    # a private name (torch._x, torch.utils._x, a leading underscore imported from torch) may
    # change in any torch release; the tools and benchmarks may use them, the library does not
    import ast
    from pathlib import Path

    import xrfm_torch

    found = []
    for path in Path(xrfm_torch.__file__).parent.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names: list[str] = []
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("torch"):
                names = [node.module or ""] + [f"{node.module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names if a.name.startswith("torch")]
            elif (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id == "torch"
            ):
                names = [f"torch.{node.attr}"]
            private = [n for n in names if any(p.startswith("_") for p in n.split("."))]
            found += [f"{path.name}:{node.lineno} {n}" for n in private]
    assert found == []
