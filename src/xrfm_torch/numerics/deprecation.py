"""Old names kept for a deprecation period: one helper, so every alias warns the same way."""

from __future__ import annotations

import warnings
from typing import Any


def renamed(new: str, old: str, *, attribute: bool = False) -> Any:
    """A class member ``old`` that warns ``DeprecationWarning`` and forwards to member ``new``.

    Args:
        new: The member's current name.
        old: The deprecated name (used in the warning).
        attribute: ``new`` is a property or attribute (the alias is then a property), not a
            method.

    Example:
        >>> class A:
        ...     def input_grads(self): return 1
        ...     get_grads = renamed("input_grads", "get_grads")
    """

    def warn(obj: object) -> None:
        warnings.warn(
            f"{type(obj).__name__}.{old} is deprecated; use {new}",
            DeprecationWarning,
            stacklevel=3,
        )

    if attribute:

        def get(self: Any) -> Any:
            warn(self)
            return getattr(self, new)

        return property(get, doc=f"Deprecated: ``{new}``.")

    def method(self: Any, *args: Any, **kwargs: Any) -> Any:
        warn(self)
        return getattr(self, new)(*args, **kwargs)

    method.__doc__ = f"Deprecated: :meth:`{new}`."
    method.__name__ = old
    return method
