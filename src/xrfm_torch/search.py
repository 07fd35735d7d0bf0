"""The hyperparameter search space of xRFM, in one place, for Optuna, scikit-learn and Hydra.

Start: TabArena's space for xRFM (bandwidth log-uniform [0.5, 200], kernel exponent, p between
the exponent and 2, ridge log-uniform [1e-6, 10], diagonal or full ``M``), plus this package's
own knobs (input maps, ``max_leaf_size``, ``linear_mix``). The kernel is always the ``Lpq``
Laplace kernel ``exp(-||x - z||_p^q / L^q)``: ``p = 2, q = 1`` is the Laplace kernel, so the
kernel choice is the choice of ``p`` and ``q``. ``p`` is drawn from [1.4, 2] and ``q`` from
[0.7, 1.4], so ``q <= p`` always holds (the kernel stays positive definite) without a derived
parameter, which Hydra's sweeper cannot express.

Three views of :data:`SPACE`:

- :func:`suggest`: estimator arguments from an Optuna trial (``XRFMRegressor(**suggest(trial))``);
- :func:`sklearn_distributions`: ``param_distributions`` for scikit-learn's
  ``RandomizedSearchCV`` on the estimators;
- :func:`hydra_params`: the ``hydra.sweeper.params`` of ``conf/hparams_search/xrfm_optuna.yaml``
  (a test keeps the YAML equal to it).

Objective: the validation metric. The leaves also make validation-based choices (iterations,
exponent and ridge refinements, temperature), so a tuned model's validation score is optimistic:
report the test rows, or cross-fitted bags' out-of-fold score (``n_bags``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from xrfm_torch.kernels import LpqLaplaceKernel


@dataclass(frozen=True)
class Param:
    """One searched hyperparameter.

    Attributes:
        kind: ``"log"`` (log-uniform float), ``"float"`` (uniform) or ``"choice"``.
        low: Lower end (floats).
        high: Upper end (floats).
        choices: The values (``"choice"``).
        hydra: The config key it sets in ``train.py``'s config.
    """

    kind: Literal["log", "float", "choice"]
    hydra: str
    low: float = 0.0
    high: float = 0.0
    choices: tuple[Any, ...] = ()


#: name -> distribution. ``bandwidth``, ``p`` and ``q`` build the kernel; the others are
#: estimator arguments of the same name.
SPACE: dict[str, Param] = {
    "bandwidth": Param("log", "model.kernel.bandwidth", 0.5, 200.0),
    "q": Param("float", "model.kernel.q", 0.7, 1.4),
    "p": Param("float", "model.kernel.p", 1.4, 2.0),
    "reg": Param("log", "model.leaf.reg", 1e-6, 10.0),
    "diag": Param("choice", "model.leaf.diag", choices=(True, False, "auto")),
    "input_transform": Param(
        "choice",
        "model.input_transform",
        choices=("auto", "identity", "quantile", "quantile+raw", "log", "quantile+log"),
    ),
    "max_leaf_size": Param("choice", "model.max_leaf_size", choices=(2000, 5000, 10000, 20000)),
    "linear_mix": Param("float", "model.leaf.linear_mix", 0.0, 0.5),
}

KERNEL_KEYS = ("bandwidth", "p", "q")


def estimator_params(values: dict[str, Any]) -> dict[str, Any]:
    """Estimator arguments from one value per :data:`SPACE` name (the kernel built from three)."""
    unknown = set(values) - set(SPACE)
    if unknown:
        raise ValueError(f"unknown search-space names {sorted(unknown)}; known: {sorted(SPACE)}")
    out = {k: v for k, v in values.items() if k not in KERNEL_KEYS}
    if any(k in values for k in KERNEL_KEYS):
        out["kernel"] = LpqLaplaceKernel(
            float(values.get("bandwidth", 10.0)),
            p=float(values.get("p", 2.0)),
            q=float(values.get("q", 1.0)),
        )
    return out


def suggest(trial: Any) -> dict[str, Any]:
    """Estimator arguments drawn by an Optuna ``trial`` (``suggest_float`` / ``_categorical``).

    Example::

        def objective(trial):
            model = XRFMRegressor(**suggest(trial), random_state=0)
            model.fit(X, y, eval_set=(X_val, y_val))
            return mean_squared_error(y_val, model.predict(X_val))
    """
    values: dict[str, Any] = {}
    for name, p in SPACE.items():
        if p.kind == "choice":
            values[name] = trial.suggest_categorical(name, list(p.choices))
        else:
            values[name] = trial.suggest_float(name, p.low, p.high, log=p.kind == "log")
    return estimator_params(values)


class KernelDistribution:
    """Draws an ``LpqLaplaceKernel`` from the space's bandwidth, ``p`` and ``q`` (``rvs``).

    scikit-learn's ``RandomizedSearchCV`` samples any object with an ``rvs(random_state=)``.
    """

    def rvs(self, random_state: Any = None) -> LpqLaplaceKernel:
        """One kernel; ``random_state`` as in scipy (an int, a generator or ``None``)."""
        from sklearn.utils import check_random_state

        rng = check_random_state(random_state)
        b, p, q = (SPACE[k] for k in KERNEL_KEYS)
        values = {
            "bandwidth": float(b.low * (b.high / b.low) ** rng.uniform()),
            "p": float(rng.uniform(p.low, p.high)),
            "q": float(rng.uniform(q.low, q.high)),
        }
        return estimator_params(values)["kernel"]


def sklearn_distributions() -> dict[str, Any]:
    """``param_distributions`` for ``RandomizedSearchCV(XRFMRegressor(), ...)`` (needs scipy)."""
    from scipy import stats

    out: dict[str, Any] = {"kernel": KernelDistribution()}
    for name, p in SPACE.items():
        if name in KERNEL_KEYS:
            continue
        if p.kind == "choice":
            out[name] = list(p.choices)
        elif p.kind == "log":
            out[name] = stats.loguniform(p.low, p.high)
        else:
            out[name] = stats.uniform(p.low, p.high - p.low)
    return out


def hydra_params() -> dict[str, str]:
    """The Hydra Optuna sweeper's ``params``: config key -> distribution string."""

    def text(v: Any) -> str:
        return str(v).lower() if isinstance(v, bool) else str(v)

    out = {}
    for p in SPACE.values():
        if p.kind == "choice":
            out[p.hydra] = f"choice({', '.join(text(c) for c in p.choices)})"
        elif p.kind == "log":
            out[p.hydra] = f"tag(log, interval({p.low:g}, {p.high:g}))"
        else:
            out[p.hydra] = f"interval({p.low:g}, {p.high:g})"
    return out
