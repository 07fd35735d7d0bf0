"""Input maps: what the trees see of each feature, and how the map is chosen.

Numeric columns raw, as normal scores or both; category blocks; missing-value indicators.

Layer 3: imports :mod:`xrfm_torch.leaf` (the probe leaves) and the layers below.
"""

from xrfm_torch.inputs.categories import CategoryColumns
from xrfm_torch.inputs.input_map import INPUT_MAPS, InputMap
from xrfm_torch.inputs.transforms import QuantileNormal, Standardize

__all__ = ["INPUT_MAPS", "CategoryColumns", "InputMap", "QuantileNormal", "Standardize"]
