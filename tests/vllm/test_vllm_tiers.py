"""Opt-in: vLLM 0.33's own secondary tiers under the tier kit, and the
hand reproductions of what it finds (docs/FINDINGS.md, F8, F9, F10 and F11).

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
        "F11_fs_tier_failed_batch_keeps_keys.py",
    ],
)
def test_tier_hand_reproduction(directory: object, script: str) -> None:
    result = run(str(FINDINGS / script), str(directory))
    assert "REPRODUCED" in result.stdout, result.stdout + result.stderr
    assert result.returncode == 1


TIERED_AUDIT = """
import sys
import attrs
from kvoffload.spec.profile import TierPoll, profile_named
from kvoffload.stateful import audit
from kvoffload.stateful.vllm_targets import known_finding, make_tiered_factory
factory = make_tiered_factory(sys.argv[1])
profile = profile_named("vllm-0.33-tiered")
flip = {"tier_poll": TierPoll.STEP_END, "max_promotions_in_flight": 0,
        "promotion_offers_chain": True, "prefix_walks_promotions": True,
        "reset_holds_promotions": False, "stores_completed_whole": False}
if sys.argv[2] in flip:  # one option set as kvoffload's own manager has it
    profile = attrs.evolve(profile, **{sys.argv[2]: flip[sys.argv[2]]})
profile = attrs.evolve(profile, has_reset=sys.argv[3] == "reset")
report = audit(factory, policy="lru", profile=profile, seed=int(sys.argv[4]),
               max_examples=int(sys.argv[5]), illegal_calls=False, name="tiered")
print(report.verdict())
finding = known_finding("0.33.0", "tiered", report)
print(finding.id if finding is not None else "-")
print(report.message or "")
"""


@needs_release
@params
@pytest.mark.parametrize(
    ("option", "reset", "seed", "verdict", "finding"),
    [
        ("-", "no-reset", "1", "PASS", "-"),
        ("-", "reset", "0", "FAIL: invariant 6 events", "F10"),
        ("tier_poll", "no-reset", "0", "FAIL: invariant 2/3/5 eviction", "-"),
        ("max_promotions_in_flight", "no-reset", "0", "FAIL: invariant lookup", "-"),
        ("promotion_offers_chain", "no-reset", "0", "FAIL: invariant lookup", "-"),
        ("prefix_walks_promotions", "no-reset", "0", "FAIL: invariant lookup", "-"),
        ("reset_holds_promotions", "reset", "0", "FAIL: invariant lookup", "-"),
        ("stores_completed_whole", "no-reset", "0", "FAIL: invariant no crash", "-"),
    ],
)
def test_vllm_tiered_audit(
    directory: object, option: str, reset: str, seed: str, verdict: str, finding: str
) -> None:
    """vLLM's tiering manager passes under ``vllm-0.33-tiered`` (resets
    aside), fails on F10 with resets, and fails with any one of its
    options set as kvoffload's own tiered manager has it."""
    examples = "300" if verdict == "PASS" else "500"
    result = run("-c", TIERED_AUDIT, str(directory), option, reset, seed, examples)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith(verdict), result.stdout
    assert lines[1] == finding, result.stdout


STEPS = """
import sys
from kvoffload.spec.invariants import Step, check_step
from kvoffload.spec.profile import profile_named
from kvoffload.stateful.harness import KitConfig
from kvoffload.stateful.swarm import observe_runs
from kvoffload.stateful.vllm_targets import make_tiered_factory
config = KitConfig(make_tiered_factory(sys.argv[1]), policy="lru", max_blocks=6, num_keys=12,
                   profile=profile_named("vllm-0.33-tiered"), supports_reset=False,
                   illegal_calls=False)
found, polled = [], 0
def observe(before, op, after):
    global polled
    step = Step(before, op, after, op.apply_to(before)[1])
    found.extend(f"{op!r}: {v}" for v in check_step(step))
    polled += before.poll_for(op) is not before
observe_runs(config, 60, observe)
print(len(found), polled)
print("\\n".join(found[:5]))
"""


@needs_release
@params
def test_vllm_tiered_steps_keep_the_step_invariants(directory: object) -> None:
    """Every step of the tiered target follows the lifecycle table, a
    call's poll first (its promotions' COMPLETE_STORE, its cascades'
    COMPLETE_LOADs), and the other step invariants."""
    result = run("-c", STEPS, str(directory))
    assert result.returncode == 0, result.stderr
    violations, polls = result.stdout.split()[:2]
    assert violations == "0", result.stdout
    assert int(polls) >= 100, result.stdout


@needs_release
@params
def test_tiered_hand_reproduction(directory: object) -> None:
    result = run(str(FINDINGS / "F10_reset_announces_dropped_promotion.py"), str(directory))
    assert "REPRODUCED" in result.stdout, result.stdout + result.stderr
    assert result.returncode == 1
