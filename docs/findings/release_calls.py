"""Call a vLLM release's CPU manager in its own API, whatever its generation.

The finding scripts beside this file use it so that each shows a behaviour
directly on the release's ``CPUOffloadingManager`` (no kvoffload adapter, no
kit): only the spelling of each call changes with the generation (block-hash
lists in 0.19; no request context on ``touch``/``complete_*`` in 0.20;
``num_chunks`` from 0.30). Usage: ``python docs/findings/F1_....py DIR...``.
"""

from __future__ import annotations

import sys
from typing import Any

from kvoffload.spec.keys import make_offload_key
from kvoffload.vllm_release import VllmRelease, load_release, unload_release


def key(name: str) -> bytes:
    """A key (block hash + group 0) named ``name`` for reading."""
    return make_offload_key(name.encode().ljust(8, b"."), 0)


def show(keys: Any) -> str:
    return "[" + ", ".join(bytes(k)[:8].decode().rstrip(".") for k in keys) + "]"


class Calls:
    """The release's manager, called as its generation spells each call."""

    def __init__(self, release: VllmRelease, capacity: int, policy: str = "lru", **kw: Any):
        self.release = release
        self.m = release.new_manager(capacity, policy, **kw)
        self.ctx = release.new_context("req-1")
        self.old = release.features.block_hash_api
        self.touch_ctx = release.features.touch_context

    def lookup(self, k: bytes) -> Any:
        if self.old:
            return self.m.lookup([k]) == 1
        return self.release.lookup_answer(self.m.lookup(k, self.ctx))

    def store(self, *keys: bytes) -> Any:
        if self.old:
            out = self.m.prepare_store(list(keys))
            return None if out is None else (out.block_hashes_to_store, out.block_hashes_evicted)
        out = self.m.prepare_store(list(keys), self.ctx)
        return None if out is None else (out.keys_to_store, out.evicted_keys)

    def complete_store(self, *keys: bytes, success: bool = True) -> None:
        if self.old or not self.touch_ctx:
            self.m.complete_store(list(keys), success)
        else:
            self.m.complete_store(list(keys), self.ctx, success)

    def store_and_complete(self, *keys: bytes) -> Any:
        result = self.store(*keys)
        if result is not None:
            self.complete_store(*result[0])
        return result

    def load(self, *keys: bytes) -> Any:
        if self.old:
            return self.m.prepare_load(list(keys))
        return self.m.prepare_load(list(keys), self.ctx)

    def complete_load(self, *keys: bytes) -> None:
        if self.old or not self.touch_ctx:
            self.m.complete_load(list(keys))
        else:
            self.m.complete_load(list(keys), self.ctx)

    def touch(self, *keys: bytes) -> None:
        if self.old or not self.touch_ctx:
            self.m.touch(list(keys))
        else:
            self.m.touch(list(keys), self.ctx)

    def free_slots(self) -> int:
        """Slots neither tracked nor leaked: the pool's own count."""
        total = getattr(self.m, "_num_chunks", None) or getattr(self.m, "_num_blocks")
        allocated = getattr(self.m, "_num_allocated_chunks", None)
        if allocated is None:
            allocated = self.m._num_allocated_blocks
        return int(total - allocated + len(self.m._free_list))


def for_each_release(check: Any) -> int:
    """Run ``check(release) -> bool`` (True: the behaviour shows) on each
    release directory given on the command line; print one line per
    release; exit status 1 if the behaviour showed in any."""
    shown = False
    for directory in sys.argv[1:]:
        release = load_release(directory)
        present = bool(check(release))
        print(f"vLLM {release.version}: {'REPRODUCED' if present else 'not present'}")
        shown = shown or present
        unload_release()
    return 1 if shown else 0
