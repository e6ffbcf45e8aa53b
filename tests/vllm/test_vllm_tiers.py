"""Opt-in: vLLM 0.33's own secondary tiers under the tier kit, and the
hand reproductions of what it finds (docs/FINDINGS.md, F8, F9 and F10).

    KVOFFLOAD_VLLM_DIRS=/tmp/vllm python -m pytest tests/vllm/test_vllm_tiers.py -q

Each release runs in its own process (one process holds one ``vllm``).
"""

from __future__ import annotations

import pytest

from tests.vllm.test_vllm_releases import DIRS, FINDINGS, needs_release, run, version_of

TIERED = [d for d in DIRS if version_of(d) >= (0, 33)]
params = pytest.mark.parametrize("directory", TIERED, ids=[d.name for d in TIERED])

AUDIT = """
import sys
import attrs
from kvoffload.spec.profile import profile_named
from kvoffload.stateful import audit_tier
from kvoffload.stateful.vllm_tiers import release_tier_factories
from kvoffload.vllm_release import load_release
factories = release_tier_factories(load_release(sys.argv[1]))
profile = profile_named("vllm-0.33")
if sys.argv[3] == "fresh-misses":  # the one option F9 is about, set the other way
    profile = attrs.evolve(profile, tier_stale_misses=False)
report = audit_tier(factories[sys.argv[2]], seed=int(sys.argv[4]), chunk_bytes=4096,
                    profile=profile, max_examples=int(sys.argv[5]))
print(report.verdict())
print(report.message or "")
"""


@needs_release
@params
@pytest.mark.parametrize(
    ("tier", "profile", "verdict"),
    [
        ("example", "vllm-0.33", "FAIL: invariant T1 tier readable"),  # F8
        ("fs", "vllm-0.33", "PASS"),
        # F9: the stale MISS is an eviction with no cascade since (T0 under
        # tier_evicts_on_store), before a promotion of the key can show T1
        ("fs", "fresh-misses", "FAIL: invariant T0 tier lifecycle"),
    ],
)
def test_vllm_tier_audit(directory: object, tier: str, profile: str, verdict: str) -> None:
    examples = "150" if verdict == "PASS" else "500"
    result = run("-c", AUDIT, str(directory), tier, profile, "1", examples)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[0] == verdict, result.stdout
    if tier == "example":
        assert "wrote nothing" in result.stdout


@needs_release
@params
@pytest.mark.parametrize(
    "script",
    [
        "F8_example_tier_loads_no_bytes.py",
        "F9_fs_tier_stale_miss.py",
        "F10_fs_tier_failed_batch_keeps_keys.py",
    ],
)
def test_tier_hand_reproduction(directory: object, script: str) -> None:
    result = run(str(FINDINGS / script), str(directory))
    assert "REPRODUCED" in result.stdout, result.stdout + result.stderr
    assert result.returncode == 1
