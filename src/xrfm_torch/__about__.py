"""Package version (single source for pyproject)."""

__version__ = "0.1.0"
