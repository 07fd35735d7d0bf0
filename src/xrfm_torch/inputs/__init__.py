"""Input maps: what the trees see of each feature (raw, normal scores, both) and how it is chosen.

Layer 3: imports :mod:`xrfm_torch.leaf` (the probe leaves) and the layers below.
"""

from xrfm_torch.inputs.transforms import INPUT_MAPS, InputMap, QuantileNormal

__all__ = ["INPUT_MAPS", "InputMap", "QuantileNormal"]
