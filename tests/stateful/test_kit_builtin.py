"""The kit on the built-in managers: every mode passes, the tools work."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence

import pytest

from kvoffload import (
    CPUBackend,
    CPUOffloadingManager,
    FilterReusedOffloadingManager,
    LRUCachePolicy,
    OffloadingManagerCore,
    OffloadKey,
    ReqContext,
)
from kvoffload.spec.errors import IllegalTransitionError
from kvoffload.spec.invariants import Invariant
from kvoffload.spec.model import (
    CompleteLoad,
    CompleteStore,
    Lookup,
    Operation,
    PrepareLoad,
    PrepareStore,
    TakeEvents,
    Touch,
)
from kvoffload.spec.profile import LEGACY
from kvoffload.stateful import (
    KitConfig,
    LegacyManagerAdapter,
    audit,
    conformance_test,
    machine_test_case,
)
from kvoffload.stateful.check import check_exhaustively
from kvoffload.stateful.harness import Discrepancy, Harness
from kvoffload.stateful.replaying import REPLAY_END, Replay
from kvoffload.stateful.shrink import replay, shrink
from kvoffload.stateful.targets import BUILTIN_TARGETS, cpu_lru, tiered_fs

# the file tier opens a directory per manager, and the check builds one per
# sequence: its tiered row runs in tests/stateful/test_kit_tiered.py instead
EXHAUSTIVE_TARGETS = [t for t in BUILTIN_TARGETS if t.factory is not tiered_fs]


@pytest.mark.parametrize("target", EXHAUSTIVE_TARGETS, ids=lambda t: t.name)
def test_builtin_targets_pass_the_exhaustive_check(target: object) -> None:
    from kvoffload.stateful.targets import BuiltinTarget

    assert isinstance(target, BuiltinTarget)
    report = check_exhaustively(
        target.factory, policy=target.policy, depth=4, reuse_filter=target.reuse_filter,
        profile=target.audit_profile,
    )
    assert report.passed, report.render()
    assert report.states > 100


test_cpu_lru_conformance_one_liner = conformance_test(cpu_lru, policy="lru", max_examples=30)

TestCpuLruMachine = machine_test_case(cpu_lru, policy="lru")


class _MRUTouchLRU(LRUCachePolicy):
    """Touches put keys at the evicting end. A subclass, not an instance
    attribute: the compiled build dispatches to overridden methods only."""

    def touch(self, keys: Sequence[OffloadKey]) -> None:
        super().touch(list(reversed(keys)))


class _EvictsMRU(CPUOffloadingManager):
    """LRU in name, MRU in deed: touches put keys at the evicting end."""

    def __init__(self, num_blocks: int) -> None:
        policy = _MRUTouchLRU(num_blocks)
        OffloadingManagerCore.__init__(self, CPUBackend(16, num_blocks), policy, True)
        self.cache_policy = "lru"


def _evicts_mru(num_blocks: int) -> CPUOffloadingManager:
    return _EvictsMRU(num_blocks)


def test_audit_finds_a_wrong_victim_order_and_the_script_replays_it() -> None:
    report = audit(_evicts_mru, policy="lru", factory_import=f"{__name__}:_evicts_mru")
    assert not report.passed
    # an inspectable manager's recency order is compared after every step
    assert report.invariant is Invariant.POLICY_STATE
    assert report.script is not None and report.calls <= 8
    # The script runs as it stands (it imports the factory from this module)
    # and stops at the offending call, saying what the specification expects.
    namespace: dict[str, object] = {}
    with pytest.raises(AssertionError, match="the lru model says") as raised:
        exec(compile(report.script, "<replay>", "exec"), namespace)
    assert "[policy state] order is" in str(raised.value)
    replay = namespace["replay"]
    assert isinstance(replay, Replay) and isinstance(replay.harness.manager, CPUOffloadingManager)
    calls = [line for line in report.script.splitlines() if line.startswith(("m.", "out = m."))]
    assert len(calls) == report.calls
    assert report.script.splitlines()[-1] == REPLAY_END


def test_the_same_defect_passes_as_any_policy() -> None:
    # a different (legal) victim choice is fine when no policy is demanded
    report = audit(_evicts_mru, policy="any", max_examples=40)
    assert report.passed, report.render()


def test_harness_flags_an_accepted_illegal_call() -> None:
    class Lenient(CPUOffloadingManager):
        def prepare_load(self, keys, req_context):  # type: ignore[no-untyped-def]
            try:
                return super().prepare_load(keys, req_context)
            except IllegalTransitionError:
                return super().prepare_load([], req_context)

    harness = Harness(KitConfig(lambda n: Lenient(16, n, "lru", True), policy="lru"), 2)
    key = harness.keys[0]
    with pytest.raises(Discrepancy) as raised:
        harness.step(PrepareLoad((key,)))
    assert raised.value.invariant is Invariant.ERRORS


def test_shrink_keeps_the_failure_and_drops_noise() -> None:
    config = KitConfig(_evicts_mru, policy="lru")
    k = config.keys()
    ops: list[Operation] = [
        PrepareStore((k[0], k[1])),
        TakeEvents(),
        CompleteStore((k[0], k[1]), True),
        Lookup(k[3]),
        Touch((k[0], k[1])),  # spec: k0 ends most recent; the defect: k1
        TakeEvents(),
        Lookup(k[4]),
        PrepareStore((k[2],)),  # spec evicts k1, the defect k0
    ]
    _, error = replay(config, 2, ops)
    # the recency order diverges at the touch (the manager is inspectable)
    assert isinstance(error, Discrepancy) and error.invariant is Invariant.POLICY_STATE
    shrunk = shrink(config, 2, ops, "policy state", time_budget=5.0)
    assert len(shrunk) < len(ops)
    assert Lookup(k[3]) not in shrunk and Lookup(k[4]) not in shrunk
    _, again = replay(config, 2, shrunk)
    assert isinstance(again, Discrepancy) and again.invariant is Invariant.POLICY_STATE


def test_legacy_adapter_over_a_list_api_manager_passes() -> None:
    class ListAPI:
        """Today's manager behind the block-hash-list calls."""

        def __init__(self, num_blocks: int) -> None:
            self.inner = CPUOffloadingManager(16, num_blocks, "lru", enable_events=True)
            self.ctx = ReqContext()

        def lookup(self, hashes):  # type: ignore[no-untyped-def]
            return self.inner.lookup_prefix(hashes, self.ctx)

        def prepare_load(self, hashes):  # type: ignore[no-untyped-def]
            return self.inner.prepare_load(list(hashes), self.ctx)

        def touch(self, hashes):  # type: ignore[no-untyped-def]
            self.inner.touch(list(hashes), self.ctx)

        def complete_load(self, hashes):  # type: ignore[no-untyped-def]
            self.inner.complete_load(list(hashes), self.ctx)

        def prepare_store(self, hashes):  # type: ignore[no-untyped-def]
            out = self.inner.prepare_store(list(hashes), self.ctx)
            if out is None:
                return None
            to_store, spec, evicted = list(out.keys_to_store), out.store_spec, list(
                out.evicted_keys
            )

            class Output:
                block_hashes_to_store = to_store
                store_spec = spec
                block_hashes_evicted = evicted

            return Output()

        def complete_store(self, hashes, success=True):  # type: ignore[no-untyped-def]
            self.inner.complete_store(list(hashes), self.ctx, success)

        def take_events(self):  # type: ignore[no-untyped-def]
            for event in self.inner.take_events():

                class Event:
                    block_hashes = list(event.keys)
                    block_size = event.block_size
                    medium = event.medium
                    removed = event.removed

                yield Event()

    report = audit(
        lambda n: LegacyManagerAdapter(ListAPI(n)),
        policy="lru",
        profile=LEGACY,
        max_examples=60,
    )
    assert report.passed, report.render()


def test_kit_does_not_perturb_filter_counts() -> None:
    manager = FilterReusedOffloadingManager(CPUOffloadingManager(16, 2, "lru", True), 2, 8)
    harness = Harness(KitConfig(lambda n: manager, policy="lru"), 2)
    key = harness.keys[0]
    harness.check_state()
    assert manager.count_of(key) == 0
    harness.step(CompleteLoad(()))
    assert manager.count_of(key) == 0


def test_cli_audit_exit_status_and_table() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "kvoffload", "audit", "--examples", "5", "--seed", "1",
         "--target", "kvoffload.stateful.targets:cpu_arc", "--policy", "arc"],
        capture_output=True, text=True, check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "PASS" in done.stdout
    bad = subprocess.run(
        [sys.executable, "-m", "kvoffload", "audit", "--target", "no_such_module:x"],
        capture_output=True, text=True, check=False,
    )
    assert bad.returncode == 2 and "cannot import" in bad.stderr


def test_cli_audit_reports_a_violation_with_exit_1() -> None:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.dirname(__file__), *sys.path]))
    done = subprocess.run(
        [sys.executable, "-m", "kvoffload", "audit", "--target",
         f"{__name__}:_evicts_mru", "--policy", "lru"],
        capture_output=True, text=True, check=False, env=env,
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert "FAIL" in done.stdout and "m.prepare_store" in done.stdout
