"""The README is executable: every shell command and Python block in it, as written, runs here.

The text is read from README.md at test time, so an edited snippet is tested as edited. Shell
commands come from the ``bash`` blocks and from inline spans that start with ``python ``; each
``&&`` step is run, or, for the set-up steps that CI itself runs before the tests (a venv, the
torch and project installs, the test commands), checked against ``.ci/run``. Training commands
that name no dataset get a small generated one appended (``SMALL_DATA``) and a sweep's trial
count is cut to 2; everything else runs as written, from a scratch working directory. The
Python blocks run in order in one namespace seeded with small planted data under the names the
README uses (``X_train``, ``labels``, ``encoder``, ...), with every warning an error, and what
they build is checked against the behaviour the text claims.

The same for the copyable examples of docs/: their Python blocks run, and every benchmark
command's module exists and accepts every flag the command passes (``--help``; the benchmarks
themselves take hours; ``python -m bench.check_figures`` reruns a few cases).
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import shlex
import socket
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
CI = (ROOT / ".ci" / "run").read_text().replace(" -q ", " ")  # its quiet flags aside
#: Appended to a training command that names no dataset: seconds instead of minutes.
SMALL_DATA = ["dataset=synthetic", "dataset.n_samples=600", "dataset.n_features=6"]
#: Steps that set up the environment; CI runs the same before anything else (checked).
SETUP = ("python3 -m venv", ". .venv/bin/activate", "pip install")


def fenced(text: str, lang: str) -> list[str]:
    """The bodies of the ```lang blocks of ``text``, in order."""
    return re.findall(rf"```{lang}\n(.*?)```", text, flags=re.S)


def shell_commands(text: str) -> list[str]:
    """Every command of the bash blocks (comments cut) and every inline `python ...` span."""
    commands = []
    for block in fenced(text, "bash"):
        for line in block.replace("\\\n", " ").splitlines():  # continued lines joined
            line = re.split(r"\s+#\s", line, maxsplit=1)[0].strip()
            if line:
                commands.append(line)
    commands += re.findall(r"`(python [^`]+)`", text)
    return list(dict.fromkeys(commands))  # each once, in order


def steps(command: str) -> list[str]:
    return [s.strip() for s in command.split("&&")]


def test_the_readme_has_the_commands_and_blocks_this_harness_runs():
    text = README.read_text()
    commands = shell_commands(text)
    assert "python -m pytest" in commands  # the command CI runs
    assert any("hparams_search=xrfm_optuna" in c for c in commands)
    assert len(fenced(text, "python")) >= 5
    # every step is one this harness knows how to run or check
    for command in commands:
        for step in steps(command):
            assert step.startswith((*SETUP, "python ", "ruff ", "mypy", "pre-commit ")), step


def test_set_up_steps_are_the_ones_ci_runs():
    """The venv and install steps of the README are what .ci/run does on a fresh clone."""
    extras = importlib.metadata.metadata("xrfm-torch").get_all("Provides-Extra") or []
    for command in shell_commands(README.read_text()):
        for step in steps(command):
            if step.startswith("python3 -m venv"):
                assert "python3 -m venv" in CI
            elif step.startswith("pip install torch"):
                # .ci/run's pip_install is pip install with retries
                assert step.replace("pip install ", "pip_install ") in CI, step
            elif step.startswith("pip install -e"):
                (extra,) = re.findall(r'"\.\[(\w+)\]"', step)
                assert extra in extras, f"README installs an unknown extra: {step}"
            elif step.startswith("python -m pytest") and "-m gpu" not in step:
                assert step.replace("python -m pytest", "$TEST_CMD") in CI, step


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def write_csv(path: Path) -> None:
    g = np.random.default_rng(0)
    X = g.normal(size=(300, 3))
    price = np.sin(X[:, 0]) + X[:, 1] ** 2
    rows = ["a,b,c,price"] + [",".join(f"{v:.6g}" for v in (*r, t)) for r, t in zip(X, price)]
    path.write_text("\n".join(rows) + "\n")


def runnable(step: str, cwd: Path) -> list[str] | None:
    """The argv that runs ``step`` here, or None for a set-up step CI runs itself."""
    if step.startswith(SETUP):
        return None
    argv = shlex.split(step)
    if argv[:2] == ["python", "-m"] and argv[2] == "pytest":
        if "-m" not in argv[3:] or "gpu" not in argv:
            return None  # the default and slow tiers: what .ci/run runs (checked above)
        # in this process: the gpu tier skips on a CPU machine, no workers to start
        return [sys.executable, *argv[1:], "-q", "-p", "no:cacheprovider", "-n", "0"]
    if argv[:2] == ["python", "train.py"]:
        args = argv[2:]
        args = [re.sub(r"n_trials=\d+", "n_trials=2", a) for a in args]
        if not any(a.startswith("dataset=") for a in args):
            args += SMALL_DATA
        if any(a.startswith("dataset.path=data.csv") for a in args):
            write_csv(cwd / "data.csv")
        return [sys.executable, str(ROOT / "train.py"), *args]
    return argv


def readme_runs() -> list[str]:
    runs = []
    for command in shell_commands(README.read_text()):
        runs += [s for s in steps(command) if runnable(s, Path(".")) is not None]
    return list(dict.fromkeys(runs))


@pytest.mark.slow
@pytest.mark.parametrize("step", readme_runs())
def test_readme_command_runs_as_written(step, tmp_path):
    argv = runnable(step, tmp_path)
    assert argv is not None
    cwd = tmp_path
    if argv[0] in ("ruff", "mypy") or "pytest" in argv or "".join(argv[2:3]).startswith("bench."):
        cwd = ROOT  # the Development commands and the benchmarks run in the project
    elif argv[0] == "pre-commit":
        subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
        (tmp_path / ".pre-commit-config.yaml").write_text(
            (ROOT / ".pre-commit-config.yaml").read_text()
        )
    env = {**os.environ, "PYTHONWARNINGS": "ignore::DeprecationWarning"}
    out = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=900, env=env)
    assert out.returncode == 0, f"{step}\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
    if argv[1:2] == [str(ROOT / "train.py")]:
        text = out.stdout + out.stderr
        assert "Traceback" not in text and "Warning" not in text, text[-3000:]
        kind = "multiruns" if "-m" in argv else "runs"
        runs = list((tmp_path / "outputs").glob(f"*/{kind}/*"))
        assert runs, f"no output under {tmp_path}/outputs"
        if kind == "multiruns":  # one folder per job (2 trials or the listed kernels)
            assert len([p for p in runs[0].iterdir() if p.is_dir()]) >= 2
        else:  # what the README says a run folder holds
            said = README.read_text().split("A run writes into", 1)[1].split("\n\n", 1)[0]
            names = [n for n in re.findall(r"`([^`\s]+)`", said) if not n.startswith("outputs")]
            for name in names:
                first = re.sub(r"\{(\w+),\w+\}", r"\1", name)  # {val,test} -> val
                if "temperature_sweep" not in first:  # only where routing matters
                    assert (runs[0] / first).exists(), f"README names {name}; not in {runs[0]}"
            assert len(names) >= 8


def planted_namespace() -> dict:
    """The names the README's snippets use, bound to small planted data."""
    g = torch.Generator().manual_seed(0)

    def regression(n: int) -> tuple[torch.Tensor, torch.Tensor]:
        X = torch.randn(n, 5, generator=g)
        return X, (2 * X[:, 0]).sin() + X[:, 1] ** 2 + 0.05 * torch.randn(n, generator=g)

    X_train, y_train = regression(400)
    X_val, y_val = regression(150)
    X_test, y_test = regression(200)
    names = np.array(["cat", "dog", "eel"])
    encoder = torch.nn.Sequential(torch.nn.Linear(5, 6), torch.nn.Tanh())
    return {
        "X_train": X_train,
        "y_train": y_train,
        "X_val": X_val,
        "y_val": y_val,
        "X_test": X_test,
        "y_test": y_test,
        "X": X_train,
        "y": y_train,
        "X_fit": X_train,
        "y_fit": y_train,
        "w": torch.rand(400, generator=g) + 0.5,
        "labels": names[(X_train[:, 0] > 0).long() + (X_train[:, 1] > 0.5).long()],
        "labels_val": names[(X_val[:, 0] > 0).long() + (X_val[:, 1] > 0.5).long()],
        "encoder": encoder,
    }


def run_blocks(blocks: list[str], ns: dict, where: Path) -> None:
    os.chdir(where)
    for block in blocks:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            warnings.filterwarnings("ignore", category=DeprecationWarning)
            exec(compile(block, str(README), "exec"), ns)
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()


@pytest.fixture
def single_process(monkeypatch):
    # what torchrun sets for the README's process-group snippet: a group of one
    for key, value in {
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(free_port()),
        "RANK": "0",
        "WORLD_SIZE": "1",
    }.items():
        monkeypatch.setenv(key, value)
    cwd = os.getcwd()
    yield
    os.chdir(cwd)
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


def test_readme_python_blocks_run_and_do_what_they_say(tmp_path, single_process):
    # MLflow warns about its own type hints when mlflow.pyfunc is first imported: import it
    # here, outside the blocks' warnings-as-errors (the dev extra installs mlflow)
    pytest.importorskip("mlflow.pyfunc", reason="the README's MLflow block needs the mlflow extra")
    ns = planted_namespace()
    run_blocks(fenced(README.read_text(), "python"), ns, tmp_path)
    X_test = ns["X_test"]
    # quickstart: a fitted tree that predicts the planted function, saved and loaded
    assert (tmp_path / "model.pt").is_file()
    assert ns["pred"].shape == (200, 1) and ns["soft"].shape == (200, 1)
    # scikit-learn: text labels in, probabilities summing to 1 out, in the order of classes_
    clf = ns["clf"]
    assert list(clf.classes_) == ["cat", "dog", "eel"]
    np.testing.assert_allclose(clf.predict_proba(X_test).sum(1), 1.0, atol=1e-12)
    assert (
        clf.predict(X_test)
        == np.array(["cat", "dog", "eel"])[(X_test[:, 0] > 0).long() + (X_test[:, 1] > 0.5).long()]
    ).mean() > 0.8
    # the estimator file and the MLflow run: the same predictions from what was written
    assert (tmp_path / "clf.pt").is_file() and (tmp_path / "mlflow.db").is_file()
    import mlflow

    logged = mlflow.pyfunc.load_model(ns["info"].model_uri).predict(X_test.numpy())
    assert logged.tolist() == clf.predict(X_test).tolist()
    mlflow.set_tracking_uri(None)
    # bagging: the mean of the bags, out-of-fold predictions for every pooled row
    bags = ns["bags"]
    assert bags.oof_.shape == (550, 1)
    # head: the tree ends a torch model and the refit kept its routing
    assert ns["model"] is not None and ns["tree"].n_leaves >= 1
    # export: the program and the ONNX file predict what the model does
    program, model = ns["program"], ns["model"]
    torch.testing.assert_close(program.module()(X_test), model(X_test))
    assert (tmp_path / "model.onnx").stat().st_size > 0
    y_test = ns["y_test"][:, None]
    mean_rmse = float((y_test - y_test.mean()).square().mean().sqrt())
    assert float((model(X_test) - y_test).square().mean().sqrt()) < 0.5 * mean_rmse


def test_docs_python_blocks_run(tmp_path, single_process):
    ns = planted_namespace()
    from xrfm_torch import xRFMTree

    ns["model"] = xRFMTree().fit(ns["X"], ns["y"], generator=torch.Generator().manual_seed(0))
    ns["tree"] = xRFMTree(temperature=0.5, input_transform="identity").fit(
        ns["encoder"](ns["X"]).detach(), ns["y"], generator=torch.Generator().manual_seed(0)
    )
    ns["x_example"] = ns["x"] = ns["X_test"][:4]
    for doc in sorted((ROOT / "docs").glob("*.md")):
        run_blocks(fenced(doc.read_text(), "python"), ns, tmp_path)


def bench_commands() -> list[str]:
    found = []
    for doc in sorted((ROOT / "docs").glob("*.md")):
        for command in shell_commands(doc.read_text()):
            found += [
                s for s in steps(command) if s.startswith(("python -m bench.", "python -m tools."))
            ]
    return [c for c in found if "<" not in c.split()[2]]  # not a pattern such as bench.<name>


#: Runs each module named on the command line as ``python -m MODULE --help`` would, in one
#: process (torch and lightning imported once, not once per module), and prints a JSON object
#: {module: [exit status, help text, error text]}.
HELP_ALL = """
import contextlib, io, json, runpy, sys
out = {}
for module in sys.argv[1:]:
    text, err, status = io.StringIO(), io.StringIO(), 0
    sys.argv = [module, "--help"]
    try:
        with contextlib.redirect_stdout(text), contextlib.redirect_stderr(err):
            runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit as stop:
        status = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
    except Exception as error:  # a module that fails to import or to parse --help
        status, err = 1, io.StringIO(f"{type(error).__name__}: {error}")
    out[module] = [status, text.getvalue(), err.getvalue()]
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def help_texts() -> dict[str, list]:
    modules = sorted({shlex.split(c)[2] for c in bench_commands()})
    out = subprocess.run(
        [sys.executable, "-c", HELP_ALL, *modules],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.splitlines()[-1])


@pytest.mark.parametrize("command", bench_commands())
def test_docs_benchmark_commands_name_real_modules_and_flags(command, help_texts):
    argv = shlex.split(command)
    status, text, err = help_texts[argv[2]]
    assert status == 0, f"{argv[2]} --help: {err[-2000:]}"
    for flag in {a.split("=")[0] for a in argv[3:] if a.startswith("--")}:
        assert flag in text, f"{command}: {argv[2]} has no flag {flag}"
