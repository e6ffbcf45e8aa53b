"""Runs at scale (issue 18, item 10): defects that need more than 8 slots,
a KV-group index past one byte, or a chain longer than 32 keys are found at
the default budget; without the scale dimension they are not; a replay of a
finding at scale names its keys ``S(h, g)`` and holds."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from kvoffload.stateful import audit
from tests.stateful import scale_defects

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFECTS = ["bitmap_word_offset", "low_byte_groups", "capped_prefix"]


@pytest.mark.parametrize("name", DEFECTS)
def test_a_defect_only_scale_shows_is_found(name: str) -> None:
    factory = getattr(scale_defects, name)
    found = audit(factory, policy="lru", seed=2,
                  factory_import=f"tests.stateful.scale_defects:{name}")
    assert not found.passed, found.render()
    # the same audit without runs at scale misses it
    missed = audit(factory, policy="lru", seed=2, max_examples=150, scale=False)
    assert missed.passed, missed.render()


def test_a_replay_at_scale_holds() -> None:
    report = audit(scale_defects.capped_prefix, policy="lru", seed=2,
                   factory_import="tests.stateful.scale_defects:capped_prefix")
    assert report.script is not None and "S(" in report.script
    failing = subprocess.run([sys.executable, "-"], input=report.script, text=True,
                             cwd=REPO_ROOT, capture_output=True, timeout=120, check=False)
    assert failing.returncode == 1 and "[lookup]" in failing.stderr, failing.stderr
    fixed = report.script.replace(
        "import capped_prefix as factory", "import bitmap_word_offset as factory"
    ).replace("from tests.stateful.scale_defects", "from tests.stateful.thirdparty").replace(
        "import bitmap_word_offset as factory", "import dict_lru as factory"
    )
    passing = subprocess.run([sys.executable, "-"], input=fixed, text=True, cwd=REPO_ROOT,
                             capture_output=True, timeout=120, check=False)
    assert passing.returncode == 0 and "replay passed" in passing.stdout, passing.stderr
