"""The worker-side contract: what a transfer handler does and reports."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Collection

import attrs

from kvoffload.spec.contract import LoadStoreSpec
from kvoffload.spec.errors import TransferError

TransferSpec = tuple[LoadStoreSpec, LoadStoreSpec]
"""A transfer: ``(source spec, destination spec)``."""

TransferType = tuple[str, str]
"""A transfer's direction: ``(source medium, destination medium)``."""


def check_job_id(job_id: object) -> int:
    """``job_id`` if it is an ``int`` (not a ``bool``), else :class:`TransferError`."""
    if type(job_id) is int:
        return job_id
    if isinstance(job_id, bool) or not isinstance(job_id, int):
        raise TransferError(f"a job id must be an int, got {job_id!r}")
    return int(job_id)


def check_transfer(job_id: object, spec: object) -> tuple[int, TransferSpec]:
    """The arguments of ``transfer_async``, checked: ``job_id`` an ``int``,
    ``spec`` a pair of :class:`LoadStoreSpec`. Raises :class:`TransferError`."""
    checked = check_job_id(job_id)
    if (
        not isinstance(spec, tuple)
        or len(spec) != 2
        or not isinstance(spec[0], LoadStoreSpec)
        or not isinstance(spec[1], LoadStoreSpec)
    ):
        raise TransferError(
            f"job {checked}: a transfer spec must be a (source, destination) pair of "
            f"LoadStoreSpec, got {spec!r}"
        )
    return checked, (spec[0], spec[1])


def check_job_ids(job_ids: object) -> list[int]:
    """The argument of ``wait``, checked: a collection of job ids (ints), not
    a single id or a string. Raises :class:`TransferError`."""
    if isinstance(job_ids, (str, bytes, int)) or not isinstance(job_ids, Collection):
        raise TransferError(f"wait takes a collection of job ids, got {job_ids!r}")
    return [check_job_id(job_id) for job_id in job_ids]


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
    False) is never reported. Malformed arguments (see :func:`check_transfer`,
    :func:`check_job_ids`), a job id still in flight and a submission after
    :meth:`shutdown` raise :class:`~kvoffload.spec.errors.TransferError`
    before any memory is touched.
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
