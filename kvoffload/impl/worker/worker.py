"""The worker: one entry point that routes each transfer to its handler."""

from __future__ import annotations

import logging
from collections.abc import Collection

from kvoffload.impl.worker.base import (
    OffloadingHandler,
    TransferResult,
    TransferSpec,
    TransferType,
    check_job_ids,
    check_transfer,
)
from kvoffload.spec.contract import LoadStoreSpec
from kvoffload.spec.errors import ConfigurationError, TransferError

logger = logging.getLogger(__name__)


class OffloadingWorker:
    """Routes transfers by ``(source medium, destination medium)``.

    A transfer the worker cannot run — no handler for its media, or a handler
    that raised or refused it — is not an error for the caller: it is
    reported by :meth:`get_finished` as a failed :class:`TransferResult`, and
    :meth:`transfer_async` returns False. Likewise a handler that raises while
    reporting or waiting fails every job it still held. Each job id is
    reported exactly once per submission.

    A malformed call is the caller's mistake and raises
    :class:`~kvoffload.spec.errors.TransferError` with nothing recorded,
    reported or copied: a job id that is not an ``int``; a spec that is not
    a ``(source, destination)`` pair of ``LoadStoreSpec``; a job id whose
    previous submission has not been reported yet (in flight, or failed and
    not yet taken by :meth:`get_finished`); ``wait`` given anything but a
    collection of ``int`` job ids; any submission after :meth:`shutdown`.
    Block ids are checked when a spec is built (``CPULoadStoreSpec``,
    ``GPULoadStoreSpec``).
    """

    def __init__(self) -> None:
        self._handlers: dict[TransferType, OffloadingHandler] = {}
        self._unique_handlers: list[OffloadingHandler] = []
        self._in_flight: dict[int, tuple[OffloadingHandler, TransferType]] = {}
        self._failed: list[TransferResult] = []
        self._shut_down = False

    def register_handler(
        self,
        src_cls: type[LoadStoreSpec],
        dst_cls: type[LoadStoreSpec],
        handler: OffloadingHandler,
    ) -> None:
        """Send transfers from ``src_cls``'s medium to ``dst_cls``'s to
        ``handler``. Raises ConfigurationError if that pair has a handler."""
        transfer_type = (src_cls.medium(), dst_cls.medium())
        if transfer_type in self._handlers:
            raise ConfigurationError(
                f"a handler for {transfer_type[0]} -> {transfer_type[1]} is "
                "already registered"
            )
        self._handlers[transfer_type] = handler
        if all(handler is not known for known in self._unique_handlers):
            self._unique_handlers.append(handler)

    @property
    def transfer_types(self) -> tuple[TransferType, ...]:
        """The ``(source medium, destination medium)`` pairs it can route."""
        return tuple(self._handlers)

    def transfer_async(self, job_id: int, spec: TransferSpec) -> bool:
        """Submit job ``job_id``; True if a handler accepted it.

        Raises :class:`TransferError` for a malformed call (see the class
        docstring): a job id still unreported (reusing it would make its
        result ambiguous), after :meth:`shutdown`, or bad argument types.
        """
        job_id, (src, dst) = check_transfer(job_id, spec)
        if self._shut_down:
            raise TransferError(f"job {job_id}: the worker is shut down")
        if job_id in self._in_flight:
            raise TransferError(f"job {job_id} is already in flight")
        if any(result.job_id == job_id for result in self._failed):
            raise TransferError(f"job {job_id} failed and is not yet reported")
        spec = (src, dst)
        transfer_type = (src.medium(), dst.medium())
        handler = self._handlers.get(transfer_type)
        if handler is None:
            logger.warning(
                "job %d: no handler for %s -> %s", job_id, *transfer_type
            )
            self._fail(job_id, transfer_type)
            return False
        try:
            accepted = handler.transfer_async(job_id, spec)
        except Exception:
            logger.warning("job %d: %s -> %s failed to start", job_id,
                           *transfer_type, exc_info=True)
            accepted = False
        if not accepted:
            self._fail(job_id, transfer_type)
            return False
        self._in_flight[job_id] = (handler, transfer_type)
        return True

    def get_finished(self) -> list[TransferResult]:
        """Results since the last call: failures found at submission first,
        then each handler's results in its submission order."""
        results, self._failed = self._failed, []
        for handler in self._unique_handlers:
            try:
                finished = handler.get_finished()
            except Exception:
                logger.warning("a handler failed while reporting", exc_info=True)
                results.extend(self._fail_all_of(handler))
                continue
            for result in finished:
                if self._in_flight.pop(result.job_id, None) is not None:
                    results.append(result)
        return results

    def wait(self, job_ids: Collection[int]) -> None:
        """Block until the given jobs have finished (their results still come
        from :meth:`get_finished`). Raises :class:`TransferError` unless
        ``job_ids`` is a collection of ``int`` job ids; unknown ids are
        ignored."""
        job_ids = check_job_ids(job_ids)
        by_handler: dict[int, tuple[OffloadingHandler, list[int]]] = {}
        for job_id in job_ids:
            entry = self._in_flight.get(job_id)
            if entry is not None:
                handler = entry[0]
                by_handler.setdefault(id(handler), (handler, []))[1].append(job_id)
        for handler, ids in by_handler.values():
            try:
                handler.wait(ids)
            except Exception:
                logger.warning("a handler failed while waiting", exc_info=True)
                self._failed.extend(self._fail_all_of(handler))

    def shutdown(self) -> None:
        """Shut every handler down; jobs still in flight are dropped. Later
        submissions raise :class:`TransferError`."""
        self._shut_down = True
        for handler in self._unique_handlers:
            try:
                handler.shutdown()
            except Exception:
                logger.warning("a handler failed to shut down", exc_info=True)
        self._in_flight.clear()

    def _fail(self, job_id: int, transfer_type: TransferType) -> None:
        self._failed.append(
            TransferResult(job_id, success=False, transfer_size=0,
                           transfer_type=transfer_type)
        )

    def _fail_all_of(self, handler: OffloadingHandler) -> list[TransferResult]:
        lost = [
            (job_id, transfer_type)
            for job_id, (owner, transfer_type) in self._in_flight.items()
            if owner is handler
        ]
        for job_id, _ in lost:
            del self._in_flight[job_id]
        return [
            TransferResult(job_id, success=False, transfer_size=0,
                           transfer_type=transfer_type)
            for job_id, transfer_type in lost
        ]
