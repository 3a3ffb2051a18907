"""``with obj:`` for objects that have a ``close()``: one mixin instead of a copy per class.

:class:`ClosesOnExit` is :func:`contextlib.closing` as a base class: ``__enter__``
returns the object and ``__exit__`` calls its ``close()``, whatever the outcome
(``close()`` should be idempotent). Runners, metric loggers, progress bars and
vector envs use it.
"""

from __future__ import annotations

from types import TracebackType
from typing import Self

__all__ = ["ClosesOnExit"]


class ClosesOnExit:
    """Mixin: ``with x: ...`` closes ``x`` when the block ends, also on errors."""

    def close(self) -> None:
        """Releases what the object holds; subclasses override it."""
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
