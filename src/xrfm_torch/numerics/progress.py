"""Progress reports from inside a fit: a hook called after every RFM iteration, and a bar.

A fit of one large leaf runs for seconds to minutes between two leaf reports, so a display that
only counts leaves stands still (and then claims thousands of leaves per second). The leaves'
iteration loop (:func:`xrfm_torch.leaf.iteration.iterate`) calls :func:`report_iteration`, which
reaches the function installed with :func:`on_iteration` in the fit's context
(:mod:`xrfm_torch.numerics.context`: nothing is global, nested or concurrent fits each see their
own).
:class:`FitBar` is the tqdm bar the estimators (``verbose=True``) and the Lightning callback
``FitProgressBar`` show; tqdm comes with Lightning and is imported only when a bar is drawn.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from xrfm_torch.numerics import context

#: ``hook(t, tau)`` after iteration ``t`` of a leaf's ``0 .. tau``.
IterationHook = Callable[[int, int], None]


@contextmanager
def on_iteration(hook: IterationHook | None) -> Iterator[None]:
    """Call ``hook(t, tau)`` after every leaf iteration of the fits run inside this block."""
    with context.using(on_iteration=hook):
        yield


def report_iteration(t: int, tau: int) -> None:
    """Tell the installed hook (if any) that iteration ``t`` of ``0 .. tau`` is done."""
    hook = context.current().on_iteration
    if hook is not None:
        hook(t, tau)


class FitBar:
    """A tqdm bar over a fit's leaves that also moves with every RFM iteration.

    Args:
        desc: The bar's label.

    Use :meth:`leaf_done` as the fit's ``progress`` and :meth:`iteration` as its iteration hook
    (:func:`on_iteration`); :meth:`close` at the end.
    """

    def __init__(self, desc: str) -> None:
        self.desc = desc
        self._bar: Any = None

    def _open(self) -> Any:
        from tqdm.auto import tqdm  # a Lightning dependency

        self._bar = tqdm(desc=self.desc, unit="leaf", dynamic_ncols=True)
        return self._bar

    def iteration(self, t: int, tau: int) -> None:
        """After iteration ``t`` of ``0 .. tau`` of the leaf being fitted.

        Before the first leaf report the iterations are the fit's preparation (the input-map
        probe's and the split models' fits), so the bar says so instead of counting 0 leaves.
        """
        bar = self._open() if self._bar is None else self._bar
        if bar.total is None:  # no leaf count yet: label and iteration only
            bar.bar_format = "{desc}{postfix}"  # (tqdm writes the postfix after ", ")
            bar.set_description_str(f"{self.desc}: preparing (input maps, splits)", refresh=False)
        bar.set_postfix_str(f"RFM iteration {t}/{tau}")

    def leaf_done(self, tree: int, done: int, total: int) -> None:
        """After ``done`` of the ``total`` leaves of tree ``tree`` (a fit's ``progress``)."""
        bar = self._open() if self._bar is None else self._bar
        bar.total = total
        bar.bar_format = None  # tqdm's own: the leaves counted
        bar.set_description(f"{self.desc} (tree {tree + 1})", refresh=False)
        bar.update(done - bar.n)
        if done >= total:
            self.close()

    def close(self) -> None:
        """Close the bar in use (a later report opens a new one)."""
        if self._bar is not None:
            self._bar.close()
            self._bar = None
