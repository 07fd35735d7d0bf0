"""A fitted ``xRFMTree`` as straight-line tensor code, for ``torch.export`` and ONNX.

The eager model is written for speed on one machine, and three of its habits defeat tracing: it
reads its structure (input columns, category widths, number of training rows) from buffers with
``int()``/``tolist()``, it groups rows by leaf (``nonzero``/``bincount``: shapes that depend on
the data), and it raises on unexpected NaN (a branch on the data). :class:`ExportableTree`
reads the structure once, when it is built, computes one-hot (hard) or soft routing weights for
all rows without branches, runs each leaf on the rows with weight (a data-dependent row count,
which torch.export and ONNX represent; only branches on data are out), and turns the rows the
eager model refuses (any infinity; NaN in a numeric column that had none in training) into NaN
outputs. It shares the fitted model's buffers and tensor functions, so its predictions are the
eager ones up to float rounding. An exported graph does not chunk rows: bound memory by the
batch size.

Recipe (``docs/design-use.md``, "Export")::

    program = export_program(model, x_example)            # torch.export.ExportedProgram
    torch.export.save(program, "model.pt2")
    y = torch.export.load("model.pt2").module()(x)
    export_onnx(model, "model.onnx", x_example)           # needs the ``onnx`` extra
"""

from __future__ import annotations

import math
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, cast

import torch
from torch import Tensor, nn

from xrfm_torch.leaf.criteria import class_probabilities
from xrfm_torch.models.contract import Model, is_ensemble
from xrfm_torch.numerics.checks import as_real_dtype
from xrfm_torch.tree.partition import PartitionTree
from xrfm_torch.tree.routing import hard_weights, soft_weights

if TYPE_CHECKING:
    from xrfm_torch.models.bagging import BaggedTree
    from xrfm_torch.models.xrfm_tree import xRFMTree

#: What an exported model returns: predictions (class scores for classification) or probabilities.
Output = Literal["predict", "proba"]


class ExportableTree(nn.Module):
    """A fitted model's prediction with no Python branch on the data (``torch.export``, ONNX).

    Args:
        model: A fitted ``xRFMTree`` (its buffers are shared, not copied; later changes to the
            model's structure need a new ``ExportableTree``).
        output: ``"predict"`` (``model(x)``) or ``"proba"`` (``model.predict_proba(x)``);
            ``None``: probabilities for a classification model, else predictions.
        temperature: Routing temperature (default: the model's fitted one; 0 = hard routing).

    ``forward(x)`` takes inputs (n, d) of any real dtype and returns (n, c) in the model's
    dtype; rows the eager model would refuse are all NaN.
    """

    def __init__(
        self, model: xRFMTree, *, output: Output | None = None, temperature: float | None = None
    ) -> None:
        super().__init__()
        if not model.is_fitted:
            raise RuntimeError("ExportableTree needs a fitted xRFMTree; call .fit(X, y) first")
        output = default_output(model, output)
        if output not in ("predict", "proba"):
            raise ValueError(f"output must be 'predict' or 'proba', got {output!r}")
        if output == "proba" and model.task != "classification":
            raise ValueError("output='proba' needs a classification model")
        self.model = model
        self.output: Output = output
        imap = model.input_map
        self.layout = imap.layout()
        self.maps = imap.names
        self.n_features = imap.n_features
        temp = model.temperature_.detach() if temperature is None else temperature
        self.temperature = float(temp)
        if not math.isfinite(self.temperature) or self.temperature < 0:
            raise ValueError(f"temperature must be finite and >= 0, got {temperature!r}")
        self.softmax_scale = float(model.targets.softmax_scale_)
        self.n_outputs = model.n_outputs_
        # columns where NaN is a missing cell: categorical ones and those with training NaN
        allowed = set(self.layout.categorical)
        allowed |= {self.layout.numeric[k] for k in self.layout.indicators}
        if imap.missing_values == "any":
            allowed |= set(self.layout.numeric)
        self.strict = [j for j in range(self.n_features) if j not in allowed]

    def forward(self, x: Tensor) -> Tensor:
        """Predictions (or probabilities) (n, c); NaN rows where the eager model raises."""
        if x.ndim != 2 or x.shape[1] != self.n_features:
            raise ValueError(f"expected input of shape (n, {self.n_features}), got {x.shape}")
        x = as_real_dtype(x, self.model.input_map.dtype, "x")
        imap = self.model.input_map
        shared: dict[str, Tensor] = {}  # the parts the maps share, made once
        mapped = {
            name: imap.encode_with(x, name, self.layout, shared)
            for name in dict.fromkeys(self.maps)
        }
        trees = self.model.partition_trees()
        outs = [self._tree(tree, mapped[name]) for tree, name in zip(trees, self.maps)]
        out = outs[0] if len(outs) == 1 else torch.stack(outs).mean(0)
        out = self.model.targets.decode(out)
        if self.output == "proba":
            out = class_probabilities(out, self.softmax_scale, self.model.targets.platt_)
        bad = torch.isinf(x).any(1)
        if self.strict:  # (an empty column pick reduces to True in onnxruntime, not False)
            bad = bad | torch.isnan(x[:, self.strict]).any(1)
        return torch.where(bad[:, None], torch.full_like(out, math.nan), out)

    def _tree(self, tree: PartitionTree, x: Tensor) -> Tensor:
        """``sum_l w_l(x) leaf_l(x)``, each leaf on the rows with weight, (n, c).

        The rows of a leaf are a data-dependent count, which ``torch.export`` carries as an
        unbacked size (and ONNX as ``NonZero``): shapes need not be static, only branches.
        """
        leaves = tree.leaf_list()
        if len(leaves) == 1:
            return leaves[0](x)
        if self.temperature == 0.0:
            w = hard_weights(x, tree.split_vectors_, tree.thresholds_, tree.path_sign_)
        else:
            w = soft_weights(
                x,
                tree.split_vectors_,
                tree.thresholds_,
                tree.temp_scale_,
                tree.path_sign_,
                tree.children_,
                self.temperature,
                keep_mass=self.model.config.keep_mass,
                max_leaves=self.model.config.max_soft_leaves,
            )
        out = x.new_zeros(x.shape[0], self.n_outputs)
        for leaf_id, leaf in enumerate(leaves):
            rows = (w[:, leaf_id] > 0).nonzero().squeeze(1)
            part = w[rows, leaf_id, None] * leaf(x[rows])
            out = out.index_put((rows,), part, accumulate=True)
        return out


class ExportableEnsemble(nn.Module):
    """A fitted ensemble (bags, a kernel blend, any registered kind) for export.

    The weighted mean of one :class:`ExportableTree` per single tree of the contract's
    ``single_trees()`` (a bag's weight is its member's over the member's bags): scores, or
    probabilities with ``output="proba"``, as the eager ``forward`` / ``predict_proba``.
    """

    weights: Tensor

    def __init__(
        self,
        model: Model,
        *,
        output: Output | None = None,
        temperature: float | None = None,
    ) -> None:
        super().__init__()
        if not model.is_fitted:
            raise RuntimeError(
                f"ExportableEnsemble needs a fitted {type(model).__name__}; call .fit(X, y) first"
            )
        output = default_output(model, output)
        pairs = model.single_trees()
        self.trees = nn.ModuleList(
            ExportableTree(b, output=output, temperature=temperature) for _, b in pairs
        )
        dtype = pairs[0][1].input_map.dtype
        self.register_buffer("weights", torch.tensor([w for w, _ in pairs], dtype=dtype))

    def forward(self, x: Tensor) -> Tensor:
        """Weighted mean of the single trees' exported outputs (n, c)."""
        return torch.einsum("b,bnc->nc", self.weights, torch.stack([t(x) for t in self.trees]))


def default_output(model: Any, output: Output | None) -> Output:
    """``output``, or by default probabilities for a classification model, else predictions."""
    if output is not None:
        return output
    return "proba" if getattr(model, "task", "regression") == "classification" else "predict"


def exportable(
    model: xRFMTree | BaggedTree | nn.Module | Any,
    output: Output | None = None,
    temperature: float | None = None,
) -> nn.Module:
    """The exportable form of ``model`` (an exportable module is returned as it is).

    ``model`` may be a fitted ``XRFMRegressor`` / ``XRFMClassifier``: its model ``model_`` is
    exported. The exported graph takes the estimator's encoded float matrix, as
    ``estimator.encoder_.transform`` gives it (the table itself for a table of numbers).
    """
    if isinstance(model, (ExportableTree, ExportableEnsemble)):
        return model
    if not isinstance(model, nn.Module) and hasattr(model, "model_"):  # a fitted estimator
        return exportable(model.model_, output, temperature)
    if not isinstance(model, nn.Module) or not hasattr(model, "single_trees"):
        raise TypeError(
            f"export needs a fitted xRFMTree, BaggedTree, KernelBlend or estimator, got "
            f"{type(model).__name__} (an unfitted estimator has no model_: call fit first)"
        )
    if not cast("Model", model).is_fitted:
        raise RuntimeError(f"{type(model).__name__} is not fitted; call .fit(X, y) first")
    if is_ensemble(cast("Model", model)):  # made of single trees (the contract's single_trees)
        return ExportableEnsemble(cast("Model", model), output=output, temperature=temperature)
    return ExportableTree(cast("xRFMTree", model), output=output, temperature=temperature)


def _example_rows(model: Any, example: Any) -> Tensor:
    """``example`` as the rows the exported graph takes.

    For an estimator, raw rows (a DataFrame with text columns, a list of rows) are encoded
    as it encodes them (``estimator.encode``); a tensor or a numeric array passes as it is.
    """
    if isinstance(example, Tensor):
        return example
    if not isinstance(model, nn.Module) and hasattr(model, "encode"):  # a fitted estimator
        return cast(Tensor, model.encode(example))
    return torch.as_tensor(example)  # numpy, as the estimators take


def _batch_dim() -> dict[str, dict[int, torch.export.Dim]]:
    return {"x": {0: torch.export.Dim("n", min=1)}}


def export_program(
    model: xRFMTree | BaggedTree | nn.Module | Any,
    example: Tensor | Any,
    *,
    output: Output | None = None,
    temperature: float | None = None,
) -> torch.export.ExportedProgram:
    """``torch.export`` a fitted model for any number of rows.

    Args:
        model: A fitted ``xRFMTree``, ``BaggedTree``, ``KernelBlend`` or estimator
            (:func:`exportable`), or an :class:`ExportableTree` / :class:`ExportableEnsemble`
            (inside a larger module: export that module directly).
        example: Example inputs (n, d) with ``n >= 2`` (their values do not matter); for an
            estimator also raw rows such as ``df[:2]`` (encoded by ``estimator.encode``: the
            program, like the ONNX file, takes the encoded rows).
        output: ``"predict"`` or ``"proba"``; by default probabilities for a classification
            model, else predictions (ignored for an ``ExportableTree``).
        temperature: Routing temperature (ignored for an ``ExportableTree``).

    Returns:
        The exported program; ``program.module()(x)`` predicts.
    """
    module = exportable(model, output, temperature)
    example = _example_rows(model, example)
    if example.ndim != 2 or example.shape[0] < 2:
        raise ValueError(
            f"example must be (n, d) with n >= 2 rows, got shape {tuple(example.shape)}"
        )
    return torch.export.export(module.eval(), (example,), dynamic_shapes=_batch_dim())


def export_onnx(
    model: xRFMTree | BaggedTree | nn.Module | Any,
    path: str | Path,
    example: Tensor | Any,
    *,
    output: Output | None = None,
    temperature: float | None = None,
) -> Path:
    """Write a fitted model as an ONNX file (input ``x`` (n, d), output ``y`` (n, c)).

    Needs ``onnx`` and ``onnxscript`` (``pip install "xrfm_torch[onnx]"``, which also brings
    ``onnxruntime`` to run the file). Arguments as :func:`export_program`.

    Returns:
        The path written.
    """
    try:
        import onnxscript  # noqa: F401
    except ImportError as err:
        raise ImportError(
            'ONNX export needs onnx and onnxscript: pip install "xrfm_torch[onnx]"'
        ) from err
    example = _example_rows(model, example)
    program = export_program(model, example, output=output, temperature=temperature)
    path = Path(path)
    with warnings.catch_warnings():
        # torch's ONNX exporter calls a pytree API that the same torch deprecates (a
        # FutureWarning the user can do nothing about); anything else it says still shows
        warnings.filterwarnings("ignore", message=r".*isinstance\(treespec, LeafSpec\)")
        onnx_program = torch.onnx.export(
            program, (example,), dynamo=True, input_names=["x"], output_names=["y"]
        )
    if onnx_program is None:  # pragma: no cover - the dynamo exporter always returns one
        raise RuntimeError("torch.onnx.export returned no program")
    onnx_program.save(str(path))
    return path
