"""The partition tree: splits, routing, growth, per-leaf fits, temperature, targets, uncertainty.

Layer 4: imports :mod:`xrfm_torch.inputs`, :mod:`xrfm_torch.leaf` and the layers below. The
public models built from it (:class:`~xrfm_torch.models.xRFMTree` and the ensembles) live in
:mod:`xrfm_torch.models`.
"""
