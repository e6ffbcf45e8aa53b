"""Audit managers written against the older block-hash-list API.

vLLM 0.11–0.19 have managers whose calls take lists of block hashes:
``lookup(hashes) -> int`` (length of the ready prefix), ``prepare_load``,
``touch``, ``complete_load``, ``prepare_store(hashes)`` returning an object
with ``block_hashes_to_store``, ``store_spec`` and ``block_hashes_evicted``,
``complete_store(hashes, success)`` and ``take_events()`` yielding events
with ``block_hashes``. :class:`LegacyManagerAdapter` presents such a manager
through today's key + request-context contract so the kit audits it
unchanged: offload keys are handed to it as its block hashes.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from typing import Any, Protocol

from kvoffload.spec.contract import (
    LoadStoreSpec,
    OffloadingEvent,
    OffloadingManager,
    PrepareStoreOutput,
    ReqContext,
)
from kvoffload.spec.keys import OffloadKey


class LegacyOffloadingManager(Protocol):
    """The block-hash-list interface of vLLM 0.11–0.19."""

    def lookup(self, block_hashes: Iterable[bytes]) -> int | None: ...

    def prepare_load(self, block_hashes: Iterable[bytes]) -> LoadStoreSpec: ...

    def touch(self, block_hashes: Iterable[bytes]) -> None: ...

    def complete_load(self, block_hashes: Iterable[bytes]) -> None: ...

    def prepare_store(self, block_hashes: Iterable[bytes]) -> Any: ...

    def complete_store(
        self, block_hashes: Iterable[bytes], success: bool = True
    ) -> None: ...

    def take_events(self) -> Iterable[Any]: ...


class LegacyManagerAdapter(OffloadingManager):
    """Today's :class:`OffloadingManager` over a block-hash-list manager.

    ``reset_cache`` is forwarded when the legacy manager has one;
    :attr:`supports_reset` says whether it does.
    """

    def __init__(self, legacy: LegacyOffloadingManager) -> None:
        self.legacy = legacy
        self.supports_reset = callable(getattr(legacy, "reset_cache", None))

    def lookup(self, key: OffloadKey, req_context: ReqContext) -> bool | None:
        hits = self.legacy.lookup([key])
        return None if hits is None else hits >= 1

    def lookup_prefix(
        self, keys: Iterable[OffloadKey], req_context: ReqContext
    ) -> int | None:
        return self.legacy.lookup(list(keys))

    def prepare_load(
        self, keys: Collection[OffloadKey], req_context: ReqContext
    ) -> LoadStoreSpec:
        return self.legacy.prepare_load(list(keys))

    def touch(self, keys: Collection[OffloadKey], req_context: ReqContext) -> None:
        self.legacy.touch(list(keys))

    def complete_load(
        self, keys: Collection[OffloadKey], req_context: ReqContext
    ) -> None:
        self.legacy.complete_load(list(keys))

    def prepare_store(
        self, keys: Collection[OffloadKey], req_context: ReqContext
    ) -> PrepareStoreOutput | None:
        output = self.legacy.prepare_store(list(keys))
        if output is None:
            return None
        return PrepareStoreOutput(
            keys_to_store=_as_keys(output.block_hashes_to_store),
            store_spec=output.store_spec,
            evicted_keys=_as_keys(output.block_hashes_evicted),
        )

    def complete_store(
        self,
        keys: Collection[OffloadKey],
        req_context: ReqContext,
        success: bool = True,
    ) -> None:
        self.legacy.complete_store(list(keys), success)

    def take_events(self) -> list[OffloadingEvent]:
        return [
            OffloadingEvent(
                keys=_as_keys(event.block_hashes),
                block_size=int(event.block_size),
                medium=str(event.medium),
                removed=bool(event.removed),
            )
            for event in self.legacy.take_events()
        ]

    def reset_cache(self) -> None:
        reset = getattr(self.legacy, "reset_cache", None)
        if callable(reset):
            reset()


def _as_keys(hashes: Sequence[bytes] | Iterable[bytes]) -> tuple[OffloadKey, ...]:
    return tuple(OffloadKey(bytes(h)) for h in hashes)
