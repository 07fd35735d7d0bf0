"""Fits under ``torch.use_deterministic_algorithms(True)`` on CUDA: the ops PyTorch refuses there.

PyTorch raises for a floating ``cumsum``, a ``median``/``nanmedian`` along a dimension, a
weighted ``bincount``, the NLL of ``cross_entropy``, ``histc``, ``put_`` and a ``scatter_reduce``
product on CUDA tensors in deterministic mode. Without a GPU here, two checks stand in: the
helpers of :mod:`xrfm_torch.numerics.deterministic` give torch's values on their host path, and
a fit (regression, weighted classification, CART splits, soft routing) calls those ops from
nowhere else, so no fit path reaches one of them on a CUDA tensor unguarded.
"""

from __future__ import annotations

import sys

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import xrfm_torch.numerics.deterministic as det
from conftest import planted
from xrfm_torch import LeafConfig, xRFMTree
from xrfm_torch.tree.splits import CARTSplit

aten = torch.ops.aten
HELPERS = det.__file__


def refused_on_cuda(func, args, kwargs) -> bool:
    """Whether ``func(*args, **kwargs)`` is one of the calls deterministic mode refuses on CUDA."""
    packet = func.overloadpacket
    if packet in (aten.cumsum, aten.cumsum_):
        return args[0].is_floating_point() or args[0].is_complex()
    if packet in (aten.median, aten.nanmedian):
        return len(args) > 1 or "dim" in kwargs  # with a dimension: values and indices
    if packet is aten.bincount:
        return (len(args) > 1 and args[1] is not None) or kwargs.get("weights") is not None
    if packet is aten.scatter_reduce:
        return "prod" in [a for a in args if isinstance(a, str)] + [kwargs.get("reduce")]
    return packet in (
        aten.histc,
        aten.put_,
        aten.put,
        aten.nll_loss_forward,
        aten.nll_loss2d_forward,
    )


class RefusedCalls(TorchDispatchMode):
    """Records the innermost ``xrfm_torch`` source file of every refused call."""

    def __init__(self) -> None:
        super().__init__()
        self.callers: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if refused_on_cuda(func, args, kwargs):
            frame = sys._getframe(1)
            while frame is not None and "xrfm_torch" not in frame.f_code.co_filename:
                frame = frame.f_back
            self.callers.append("?" if frame is None else frame.f_code.co_filename)
        return func(*args, **kwargs)


def weighted_classes(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    X, y = planted(n, d=5, seed=seed)
    labels = (y > y.median()).long() + (y > y.quantile(0.8)).long()  # 3 classes
    weights = torch.rand(n, generator=torch.Generator().manual_seed(seed)) + 0.5
    return X, labels, weights


FITS = {
    "regression": lambda: xRFMTree(max_leaf_size=200, leaf=LeafConfig(n_iters=1)),
    "cart": lambda: xRFMTree(max_leaf_size=200, split_rule=CARTSplit(), leaf=LeafConfig(n_iters=1)),
    "weighted_classes": lambda: xRFMTree(
        task="classification", max_leaf_size=200, leaf=LeafConfig(n_iters=1)
    ),
}


def fit_case(kind: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Inputs, targets and sample weights (or ``None``) of the fit ``FITS[kind]``."""
    if kind == "weighted_classes":
        return weighted_classes(500, seed=1)
    X, y = planted(500, d=5, seed=2)
    X[:300, 1] = 0.0  # a zero-inflated column: the value-level test looks at it
    return X, y, None


@pytest.mark.parametrize("kind", list(FITS))
def test_refused_ops_are_called_only_through_the_helpers(kind):
    X, y, w = fit_case(kind)
    model = FITS[kind]()
    mode = RefusedCalls()
    with mode:
        model.fit(X, y, sample_weight=w, generator=torch.Generator().manual_seed(0))
        model(X[:50], 0.5)  # soft routing: masses of the leaves, largest first
    assert mode.callers, "the fit reached none of the refused ops: the check tests nothing"
    assert set(mode.callers) == {HELPERS}, sorted(set(mode.callers) - {HELPERS})


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("kind", list(FITS))
def test_deterministic_cuda_fits_run_and_repeat_bit_for_bit(kind):
    X, y, w = (None if t is None else t.cuda() for t in fit_case(kind))
    torch.use_deterministic_algorithms(True)
    try:

        def fit():
            model = FITS[kind]().to("cuda")
            model.fit(X, y, sample_weight=w, generator=torch.Generator().manual_seed(0))
            return model.state_dict(), model(X[:50], 0.5)

        (a, pa), (b, pb) = fit(), fit()
    finally:
        torch.use_deterministic_algorithms(False)
    assert torch.equal(pa, pb)
    for key in a:
        same = torch.equal(a[key], b[key]) if isinstance(a[key], torch.Tensor) else a[key] == b[key]
        assert same, key


def test_helpers_on_their_host_path_give_torchs_values(monkeypatch):
    g = torch.Generator().manual_seed(3)
    x = torch.randn(40, 6, generator=g)
    x[::7, 2] = float("nan")
    x[:, 5] = float("nan")  # an all-NaN column
    codes = torch.randint(0, 5, (40,), generator=g)
    w = torch.rand(40, generator=g, dtype=torch.float64)
    plain = (det.cumsum(x, 1), det.nanmedian(x, 0), det.bincount(codes, w, 7))
    monkeypatch.setattr(det, "refused", lambda t: True)  # as on CUDA in deterministic mode
    host = (det.cumsum(x, 1), det.nanmedian(x, 0), det.bincount(codes, w, 7))
    for a, b in zip(plain, host):
        torch.testing.assert_close(a, b, rtol=0, atol=0, equal_nan=True)
    torch.testing.assert_close(host[0], x.cumsum(1), rtol=0, atol=0, equal_nan=True)
    torch.testing.assert_close(host[1], x.nanmedian(0).values, rtol=0, atol=0, equal_nan=True)
    torch.testing.assert_close(host[2], torch.bincount(codes, w, 7), rtol=0, atol=0)
    assert host[2].dtype == torch.float64 and host[2].shape == (7,)


@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_cross_entropy_by_gather_matches_torchs_value_and_gradient(monkeypatch, reduction):
    g = torch.Generator().manual_seed(4)
    labels = torch.randint(0, 4, (30,), generator=g)
    logits = torch.randn(30, 4, generator=g, dtype=torch.float64, requires_grad=True)
    expected = torch.nn.functional.cross_entropy(logits, labels, reduction=reduction)
    (g_expected,) = torch.autograd.grad(expected.sum(), logits)
    monkeypatch.setattr(det, "refused", lambda t: True)
    got = det.cross_entropy(logits, labels, reduction=reduction)
    (g_got,) = torch.autograd.grad(got.sum(), logits)
    torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(g_got, g_expected, rtol=1e-12, atol=1e-12)
    with pytest.raises(ValueError, match="reduction must be"):
        det.cross_entropy(logits, labels, reduction="sum")


def test_refused_is_off_on_the_cpu_and_without_deterministic_mode():
    assert not det.refused(torch.zeros(3))
    torch.use_deterministic_algorithms(True)
    try:
        assert not det.refused(torch.zeros(3))  # only CUDA kernels are refused
    finally:
        torch.use_deterministic_algorithms(False)
