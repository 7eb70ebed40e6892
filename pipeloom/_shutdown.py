"""``with`` and garbage collection call ``shutdown()``: shared by the loaders."""

from __future__ import annotations

from typing import Any

__all__ = ["ShutsDown"]


class ShutsDown:
    """Mixin: ``with obj:`` and garbage collection call ``obj.shutdown()``.

    ``shutdown`` must be idempotent (garbage collection may call it again).

    Example:
        >>> class Job(ShutsDown):
        ...     running = True
        ...     def shutdown(self):
        ...         self.running = False
        >>> with Job() as job:
        ...     pass
        >>> job.running
        False
    """

    def shutdown(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.shutdown()

    def __del__(self) -> None:
        try:
            self.shutdown()
        except Exception:  # interpreter shutdown: modules may be gone
            pass
