"""The lock every built-in manager hands its callers (docs/SPEC.md, "Threads
and the lock")."""

from __future__ import annotations

import threading
from types import TracebackType


class ManagerLock:
    """A non-reentrant :class:`threading.Lock` guarding one manager's state.

    It behaves as the lock it wraps (``with``, ``acquire``, ``release``,
    ``locked``); a deep copy or an unpickled copy of its manager gets a new,
    unlocked lock of its own (a bare ``threading.Lock`` cannot be copied,
    which would stop ``copy.deepcopy`` of a manager).
    """

    __slots__ = ("_lock",)

    def __init__(self) -> None:
        self._lock = threading.Lock()

    def __enter__(self) -> bool:
        return self._lock.acquire()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._lock.release()

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        """As :meth:`threading.Lock.acquire`."""
        return self._lock.acquire(blocking, timeout)

    def release(self) -> None:
        """As :meth:`threading.Lock.release`."""
        self._lock.release()

    def locked(self) -> bool:
        """Whether some thread holds the lock."""
        return self._lock.locked()

    def __deepcopy__(self, memo: dict[int, object]) -> ManagerLock:
        return ManagerLock()

    def __reduce__(self) -> tuple[type[ManagerLock], tuple[()]]:
        return ManagerLock, ()

    def __repr__(self) -> str:
        return f"<ManagerLock {'locked' if self.locked() else 'unlocked'}>"
