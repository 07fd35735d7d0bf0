"""scikit-learn estimators: :class:`XRFMRegressor` and :class:`XRFMClassifier`.

Thin adapters around :class:`~xrfm_torch.xRFMTree`: numpy or pandas in (numbers, text categories,
missing cells), numpy out, labels of any type for the classifier, ``get_params``/``set_params``/``clone``. The fitted
model is ``model_`` (head use, interpretation, ``state_dict``). Defaults are the core's: each
parameter defaults to the value of the same-named :class:`~xrfm_torch.LeafConfig` or
:class:`~xrfm_torch.TreeConfig` field, read from there; :data:`PARAMS` is the one table of where
each parameter goes.

Needs scikit-learn (``pip install 'xrfm-torch[sklearn]'``).
"""

from xrfm_torch.estimators.base import AUTO_BAG_ROWS, AUTO_BAGS, PARAMS
from xrfm_torch.estimators.classifier import XRFMClassifier
from xrfm_torch.estimators.regressor import XRFMRegressor

__all__ = [
    "AUTO_BAGS",
    "AUTO_BAG_ROWS",
    "PARAMS",
    "XRFMClassifier",
    "XRFMRegressor",
]
