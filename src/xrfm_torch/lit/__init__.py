"""Lightning pieces: the system, the datamodule and evaluation callbacks (imports the core)."""

from xrfm_torch.lit.calibration import IntervalCalibration
from xrfm_torch.lit.callbacks import (
    AGOPFeatureImportance,
    FitProgressBar,
    LeafMetrics,
    TemperatureSweep,
    TreeSummary,
)
from xrfm_torch.lit.datamodule import TabularDataModule
from xrfm_torch.lit.head import RefitXRFM, XRFMHeadModule, mlp_encoder
from xrfm_torch.lit.module import XRFMLitModule
from xrfm_torch.lit.predict import predict_rows

__all__ = [
    "AGOPFeatureImportance",
    "FitProgressBar",
    "IntervalCalibration",
    "LeafMetrics",
    "RefitXRFM",
    "TabularDataModule",
    "TemperatureSweep",
    "TreeSummary",
    "XRFMHeadModule",
    "XRFMLitModule",
    "mlp_encoder",
    "predict_rows",
]
