"""The contract every model keeps: one tree (``xRFMTree``), its bags and its kernel blends.

:class:`Model` is what callers may rely on whatever :func:`~xrfm_torch.models.factory.build_model`
returned: the common ``fit`` signature, predictions (``forward``, ``predict_proba``,
``predict_interval``), gradients and the AGOP, feature importance, the honest (out-of-fold or
validation) outputs of the last fit, the config round trip and, as an ``nn.Module``, the state
dict. ``tests/test_contract.py`` checks that each model class implements every member with the
same parameters, so the three cannot drift apart.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal, Protocol, overload, runtime_checkable

import torch
from torch import Tensor

from xrfm_torch.tree.grow import Progress
from xrfm_torch.tree.honest import HonestOutputs
from xrfm_torch.tree.interpret import ImportanceSource

if TYPE_CHECKING:
    from collections.abc import Mapping

    from xrfm_torch.models.xrfm_tree import xRFMTree


@runtime_checkable
class Model(Protocol):
    """A fitted (or to-be-fitted) xRFM model of any kind (see the module docstring)."""

    @property
    def task(self) -> str:
        """``"regression"`` or ``"classification"``."""

    @property
    def is_fitted(self) -> bool:
        """Whether ``fit`` has run (or a fitted state was loaded)."""

    @property
    def n_leaves(self) -> int:
        """Leaves over every tree the model holds."""

    @property
    def n_features_in_(self) -> int:
        """Input columns."""

    @property
    def n_outputs_(self) -> int:
        """Output columns (targets, or classes)."""

    def fit(
        self,
        X: Tensor,
        y: Tensor,
        X_val: Tensor | None = None,
        y_val: Tensor | None = None,
        *,
        sample_weight: Tensor | None = None,
        val_sample_weight: Tensor | None = None,
        generator: torch.Generator | None = None,
        progress: Progress | None = None,
    ) -> Model:
        """Fit in closed form; returns the model."""

    @overload
    def forward(
        self,
        x: Tensor,
        temperature: float | Tensor | None = None,
        *,
        return_std: Literal[False] = False,
    ) -> Tensor: ...
    @overload
    def forward(
        self, x: Tensor, temperature: float | Tensor | None = None, *, return_std: Literal[True]
    ) -> tuple[Tensor, Tensor]: ...
    def forward(
        self, x: Tensor, temperature: float | Tensor | None = None, *, return_std: bool = False
    ) -> Tensor | tuple[Tensor, Tensor]:
        """Predictions (n, c), class scores for classification (``return_std``: and std)."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """``forward`` through ``nn.Module`` (hooks included)."""

    def predict_proba(self, x: Tensor, temperature: float | Tensor | None = None) -> Tensor:
        """Class probabilities (n, K), rows summing to 1."""

    def predict_interval(
        self, x: Tensor, coverage: float = 0.9, temperature: float | Tensor | None = None
    ) -> tuple[Tensor, Tensor]:
        """Central predictive interval ``(lower, upper)``, each (n, c)."""

    def input_grads(self, x: Tensor, temperature: float | Tensor | None = None) -> Tensor:
        """Input gradients (n, c, d)."""

    def get_grads(self, x: Tensor, temperature: float | Tensor | None = None) -> Tensor:
        """:meth:`input_grads` under the reference ``xrfm``'s name."""

    def agop(self, x: Tensor | None = None, *, diag: bool = False) -> Tensor:
        """The AGOP (d, d), or its diagonal (d,)."""

    def feature_importance(self, source: ImportanceSource = "M") -> Tensor:
        """Per-input-column importance (d,), summing to 1."""

    def honest_outputs(self) -> HonestOutputs:
        """The last fit's outputs of rows it did not train on."""

    def single_trees(self) -> list[tuple[float, xRFMTree]]:
        """Its single trees with their weights in its predictions (summing to 1)."""

    def summary(self) -> dict[str, Any]:
        """The fitted model as plain data (``tree_summary.json``)."""

    def get_config(self) -> dict[str, Any]:
        """Constructor arguments as plain data."""

    def state_dict(self, *args: Any, **kwargs: Any) -> Mapping[str, Any]:
        """The fitted state (``nn.Module``)."""


def is_ensemble(model: Model) -> bool:
    """Whether a fitted ``model`` is made of other trees (bags, blends), not one tree itself."""
    return any(tree is not model for _, tree in model.single_trees())
