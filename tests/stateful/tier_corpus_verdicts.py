"""Entries of the blind tier corpus (``tests/blind_tiers``) whose "defect"
the specification allows, with the reason (docs/SPEC.md §10).

The corpus author read the contract without the tier model; where the
model decides an ambiguous point the other way, the entry is expected to
pass the kit. Read by ``scripts/measure_tier_corpus.py`` and
``tests/stateful/test_tier_kit_blind.py``.
"""

from __future__ import annotations

ALLOWED: dict[str, str] = {
    "file_chunks.skipped_key_reported_early": (
        "the tier table's row STORING | store reported, key failed | STORING or ABSENT: a "
        "store may report a key failed while another store of it is in flight, which may "
        "then make it readable (the author's reading 4 forbids it; §10 allows it)"
    ),
}
"""Entry name -> why the specification allows it."""
