"""kvoffload's vLLM 0.33 face (:mod:`kvoffload.vllm`) as kit targets.

The face speaks vLLM 0.33's contract, so the kit drives it as it drives
vLLM's own managers (:class:`~kvoffload.stateful.vllm_targets.ReleaseManager`:
shapes only), under the ``vllm-0.33`` profile::

    KVOFFLOAD_VLLM_DIR=/tmp/vllm/0.33.0 python -m kvoffload audit \\
        --target kvoffload.stateful.vllm_face:arc --policy arc --profile vllm-0.33

``KVOFFLOAD_VLLM_DIR`` names the directory ``import vllm`` finds vLLM in (an
installed one's ``site-packages``, or a release extracted by
``scripts/fetch_vllm.py``); it is loaded as ``--vllm DIR`` loads a release
(:func:`kvoffload.vllm_release.load_release`). A release already loaded in
the process is used as it is.

Targets: :data:`lru`, :data:`arc`, and :data:`filter_lru` (a
``store_threshold`` of 2 and a count table of 2: audit it with
``--policy lru --reuse-threshold 2 --tracker-size 2``). Unlike vLLM's own
managers, the face is inspectable (``phase``, ``slot_of``,
``policy_state``: its core's) and can be deep-copied, so the kit checks its
hidden state after every call and drains copies of it.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Mapping
from typing import Any

from kvoffload.spec.keys import OffloadKey
from kvoffload.spec.lifecycle import Phase
from kvoffload.stateful.vllm_targets import ManagerFactory, ReleaseManager
from kvoffload.vllm_release import VllmRelease, VllmReleaseError, load_release, loaded_release

ENV = "KVOFFLOAD_VLLM_DIR"
"""The environment variable naming the directory vLLM is loaded from."""

SMALL_TRACKER = 2
"""The count table of :data:`filter_lru`."""


def face_release() -> VllmRelease:
    """The vLLM the face runs on: the release already loaded, else the one
    under ``$KVOFFLOAD_VLLM_DIR``. Raises :class:`VllmReleaseError` when
    neither is there."""
    root = loaded_release()
    if root is not None:
        return load_release(root)
    directory = os.environ.get(ENV)
    if not directory:
        raise VllmReleaseError(
            f"set {ENV} to the directory vLLM is imported from (site-packages, "
            "or a release extracted by scripts/fetch_vllm.py)"
        )
    return load_release(directory)


class FaceTarget(ReleaseManager):
    """:class:`ReleaseManager` over the face, with the face's core's
    introspection and a deep copy that shares the release handle."""

    def phase(self, key: OffloadKey) -> Phase:
        found: Phase = self.inner.manager.phase(key)
        return found

    def slot_of(self, key: OffloadKey) -> int | None:
        found: int | None = self.inner.manager.slot_of(key)
        return found

    def policy_state(self) -> Mapping[str, object]:
        found: Mapping[str, object] = self.inner.manager.policy_state()
        return found

    def __deepcopy__(self, memo: dict[int, Any]) -> FaceTarget:
        clone = copy.copy(self)
        memo[id(self)] = clone
        clone.inner = copy.deepcopy(self.inner, memo)
        clone._contexts = copy.deepcopy(self._contexts, memo)
        clone._new_requests = list(self._new_requests)
        return clone


def face_factory(
    policy: str, store_threshold: int | None = None, max_tracker_size: int | None = None
) -> ManagerFactory:
    """``factory(num_chunks)``: the face's manager with ``policy``, events on,
    behind the filter when ``store_threshold`` is given."""

    def factory(num_blocks: int) -> FaceTarget:
        release = face_release()
        from kvoffload.vllm import KVOffloadingManager

        inner = KVOffloadingManager(
            num_chunks=num_blocks,
            cache_policy=policy,
            enable_events=True,
            store_threshold=store_threshold or 0,
            max_tracker_size=max_tracker_size or 64_000,
        )
        return FaceTarget(release, inner)

    suffix = "" if store_threshold is None else f"_filter{max_tracker_size}"
    factory.__qualname__ = factory.__name__ = f"kvoffload_vllm_{policy}{suffix}"
    return factory


lru = face_factory("lru")
arc = face_factory("arc")
filter_lru = face_factory("lru", 2, SMALL_TRACKER)

__all__ = ["ENV", "FaceTarget", "arc", "face_factory", "face_release", "filter_lru", "lru"]
