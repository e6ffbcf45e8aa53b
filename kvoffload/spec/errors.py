"""The one exception hierarchy of kvoffload.

Every error raised for bad input or an illegal call derives from
:class:`OffloadingError`. A call that raises one has changed nothing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kvoffload.spec.lifecycle import Call, Phase


class OffloadingError(Exception):
    """Root of every error kvoffload raises on purpose."""


class ConfigurationError(OffloadingError, ValueError):
    """A constructor or configuration value is out of its domain."""


class InvalidKeyError(OffloadingError, ValueError):
    """A key is not ``bytes`` or is too short to carry the group index."""

    def __init__(self, key: object, reason: str) -> None:
        super().__init__(f"invalid offload key {key!r}: {reason}")
        self.key = key
        self.reason = reason


class TierClosedError(OffloadingError):
    """A job was submitted to a secondary tier after its ``shutdown``."""


class IllegalTransitionError(OffloadingError):
    """A call is not legal for the phase a key is in (see the lifecycle table).

    ``key`` is the offending key, ``phase`` the phase found, ``call`` the call.
    """

    def __init__(self, key: bytes, phase: Phase, call: Call) -> None:
        super().__init__(
            f"{call.value} is illegal for key {key!r} in phase {phase}"
        )
        self.key = key
        self.phase = phase
        self.call = call


class TransferError(OffloadingError):
    """A worker-side transfer specification is malformed."""
