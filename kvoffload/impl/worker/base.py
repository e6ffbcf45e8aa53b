"""The worker-side contract: what a transfer handler does and reports."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Collection

import attrs

from kvoffload.spec.contract import LoadStoreSpec

TransferSpec = tuple[LoadStoreSpec, LoadStoreSpec]
"""A transfer: ``(source spec, destination spec)``."""

TransferType = tuple[str, str]
"""A transfer's direction: ``(source medium, destination medium)``."""


@attrs.frozen
class TransferResult:
    """The outcome of one transfer job.

    ``transfer_size`` is the number of bytes moved and ``transfer_time`` the
    seconds the copies took (None where unknown, e.g. for a transfer that
    never ran); ``transfer_type`` is ``(source medium, destination medium)``.
    """

    job_id: int
    success: bool
    transfer_size: int | None = None
    transfer_time: float | None = None
    transfer_type: TransferType | None = None


class OffloadingHandler(ABC):
    """Moves blocks between two media, asynchronously.

    Every job accepted by :meth:`transfer_async` is reported exactly once by
    :meth:`get_finished`. A job it did not accept (it raised or returned
    False) is never reported.
    """

    @abstractmethod
    def transfer_async(self, job_id: int, spec: TransferSpec) -> bool:
        """Start moving the blocks ``spec[0]`` names into those ``spec[1]``
        names. True if the job was submitted; False if it could not be.

        Raises :class:`~kvoffload.spec.errors.TransferError` for a malformed
        spec, before touching any memory.
        """

    @abstractmethod
    def get_finished(self) -> list[TransferResult]:
        """Results of the jobs finished since the last call, in submission
        order; never blocks."""

    @abstractmethod
    def wait(self, job_ids: Collection[int]) -> None:
        """Block until the given jobs (and every job submitted before them)
        have finished. Their results still come from :meth:`get_finished`;
        unknown ids are ignored."""

    def shutdown(self) -> None:
        """Wait for every job and release resources."""
        return None
