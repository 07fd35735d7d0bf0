"""Package version (single source for pyproject)."""

__version__ = "0.15.0.dev0"
