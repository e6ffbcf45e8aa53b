"""An audit given no seed takes ``KVOFFLOAD_AUDIT_SEED`` when it is set, and
draws a fresh seed otherwise."""

from __future__ import annotations

import pytest

from kvoffload.stateful import audit
from kvoffload.stateful.targets import cpu_lru


def test_the_environment_fixes_the_seed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KVOFFLOAD_AUDIT_SEED", "5")
    assert audit(cpu_lru, policy="lru", max_examples=3).seed == 5


def test_without_it_each_audit_draws_its_own(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KVOFFLOAD_AUDIT_SEED", raising=False)
    seeds = {audit(cpu_lru, policy="lru", max_examples=1).seed for _ in range(4)}
    assert len(seeds) > 1


def test_a_seed_that_is_not_an_integer_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KVOFFLOAD_AUDIT_SEED", "tuesday")
    with pytest.raises(ValueError, match="KVOFFLOAD_AUDIT_SEED must be an integer"):
        audit(cpu_lru, policy="lru", max_examples=1)
