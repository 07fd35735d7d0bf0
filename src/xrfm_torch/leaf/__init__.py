"""One leaf: kernel ridge regression with AGOP feature learning (:class:`LeafRFM`).

Layer 2: imports :mod:`xrfm_torch.kernels` and :mod:`xrfm_torch.numerics`.
"""

from xrfm_torch.leaf.config import LeafConfig
from xrfm_torch.leaf.model import LeafRFM

__all__ = ["LeafConfig", "LeafRFM"]
