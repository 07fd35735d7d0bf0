"""Developer tools, not benchmarks: refactor parity, the solver roofline, leaf memory, size counts.

Run from the repository root: ``python -m tools.same_models --against COMMIT``,
``python -m tools.roofline``, ``python -m tools.leaf_memory``, ``python tools/code_counts.py``.
"""
