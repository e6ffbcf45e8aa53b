"""The ``--kv-transfer-config`` lines in README.md and docs/VLLM.md are what
a user pastes: each must be valid JSON naming kvoffload's spec, and its
tier keys must pass the same checks ``KVOffloadingSpec`` runs before it
builds anything (vLLM is not needed for that)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from kvoffload.impl.tier_setup import tier_settings

ROOT = Path(__file__).resolve().parent.parent
_CONFIG = re.compile(r"--kv-transfer-config '(\{.*\})'")


def _configs(name: str) -> list[dict[str, Any]]:
    text = (ROOT / name).read_text(encoding="utf-8")
    return [json.loads(match) for match in _CONFIG.findall(text)]


@pytest.mark.parametrize("name", ["README.md", "docs/VLLM.md"])
def test_kv_transfer_configs_name_the_spec_and_pass_its_checks(name: str) -> None:
    configs = _configs(name)
    assert configs, f"{name} shows no --kv-transfer-config"
    for config in configs:
        assert config["kv_connector"] == "OffloadingConnector"
        extra = config["kv_connector_extra_config"]
        assert extra["spec_name"] == "KVOffloadingSpec"
        assert extra["spec_module_path"] == "kvoffload.vllm"
        assert int(extra["cpu_bytes_to_use"]) > 0
        tier_settings(extra)  # raises ConfigurationError on a bad tier key


def test_vllm_md_shows_a_tier_configuration() -> None:
    tiered = [c for c in _configs("docs/VLLM.md")
              if c["kv_connector_extra_config"].get("secondary_tiers")]
    assert tiered
    settings = tier_settings(tiered[0]["kv_connector_extra_config"])
    assert settings is not None
