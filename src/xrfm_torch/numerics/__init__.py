"""Numerics on tensors: argument checks, AGOP algebra, kernel ridge solvers, module state helpers.

Layer 0: imports only torch. Everything above builds on these functions.
"""
