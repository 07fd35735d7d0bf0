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
