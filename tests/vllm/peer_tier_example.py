"""A vLLM 0.33 tier that serves a peer's requests (it overrides
``serve_external_requests``), as the p2p tier does: kvoffload refuses it,
since it gives tiers no parent manager. Imported by module path only, with
a 0.33 release loaded (``tests/vllm/test_vllm_tierspec.py``)."""

from __future__ import annotations

from typing import Any

from vllm.v1.kv_offload.tiering.example.manager import ExampleSecondaryTierManager


class PeerTier(ExampleSecondaryTierManager):  # type: ignore[misc]
    def serve_external_requests(self, parent: Any) -> None:
        return None
