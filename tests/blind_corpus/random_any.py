"""Design I: victims drawn at random (seeded) among the eligible keys.

Audited as policy "any": the docs allow any legal victim set.
"""

from __future__ import annotations

import random

from kvoffload import OffloadingManager, OffloadKey

from ._skeleton import Eligible, HookedManager


class RandomVictims(HookedManager):
    def __init__(self, num_blocks: int, seed: int = 12345) -> None:
        super().__init__(num_blocks)
        self.rng = random.Random(seed)
        self.members: list[OffloadKey] = []  # insertion order, for determinism

    def policy_insert(self, keys: list[OffloadKey]) -> None:
        self.members.extend(keys)

    def policy_touch(self, key: OffloadKey) -> None:
        """Random replacement keeps no recency."""

    def _draw(self, pool: list[OffloadKey], need: int) -> list[OffloadKey]:
        return self.rng.sample(pool, need)

    def policy_victims(self, need: int, eligible: Eligible) -> list[OffloadKey] | None:
        pool = [k for k in self.members if eligible(k)]
        if len(pool) < need:
            return None
        return self._draw(pool, need)

    def policy_forget(self, key: OffloadKey) -> None:
        self.members.remove(key)

    def policy_clear(self) -> None:
        self.members.clear()


def make(num_blocks: int) -> OffloadingManager:
    return RandomVictims(num_blocks)


class DrawsWithReplacement(RandomVictims):
    def _draw(self, pool: list[OffloadKey], need: int) -> list[OffloadKey]:
        return [self.rng.choice(pool) for _ in range(need)]  # slip: may repeat a victim


def make_draws_with_replacement(num_blocks: int) -> OffloadingManager:
    return DrawsWithReplacement(num_blocks)
