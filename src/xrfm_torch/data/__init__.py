"""Datasets: registry, loaders and the benchmark protocol (numpy only)."""

from xrfm_torch.data.protocol import ProtocolData, Standardizer, prepare, protocol_split
from xrfm_torch.data.registry import DATASETS, DatasetSpec, load_dataset, read_csv, register_dataset

__all__ = [
    "DATASETS",
    "DatasetSpec",
    "ProtocolData",
    "Standardizer",
    "load_dataset",
    "prepare",
    "protocol_split",
    "read_csv",
    "register_dataset",
]
