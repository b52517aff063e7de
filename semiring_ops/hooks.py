"""Functions a lower layer calls and a higher one provides, so that imports run one way only (ops/ never imports
structures/ or blocks/, lazy/ never imports blocks/): the lower module declares a :class:`Hook`, the module that owns
the function installs it when imported. ``import semiring_ops`` imports every layer, so every hook is installed
before any call can reach one."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["Hook"]


class Hook:
    """A function slot: ``hook(*args)`` calls what ``hook.install(fn)`` put there.

    name: what calls it (for the error); provider: the module that installs it.
    """

    __slots__ = ("_fn", "name", "provider")

    def __init__(self, name: str, provider: str) -> None:
        self.name, self.provider = name, provider
        self._fn: Callable[..., Any] | None = None

    def install(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """Sets the function (usable as a decorator); returns it unchanged."""
        self._fn = fn
        return fn

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self._fn is None:
            raise RuntimeError(f"{self.name} needs {self.provider}, which has not been imported (import semiring_ops)")
        return self._fn(*args, **kwargs)

    def __repr__(self) -> str:
        return f"Hook({self.name!r}, provider={self.provider!r}, installed={self._fn is not None})"
