"""Opt-in: real vLLM releases, loaded, reproduced by hand and audited.

Set ``KVOFFLOAD_VLLM_DIRS`` to release directories separated by ``os.pathsep``
(each one a directory from which ``import vllm`` finds a release, e.g. made by
``python scripts/fetch_vllm.py 0.33.0 DIR``), or to a directory whose
subdirectories are such releases. Without it every test here is skipped: the
default run downloads and needs nothing.

    python scripts/fetch_vllm.py 0.22.0 /tmp/vllm/0.22.0
    KVOFFLOAD_VLLM_DIRS=/tmp/vllm python -m pytest tests/vllm -q

Each release runs in its own process (one process holds one ``vllm``).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
FINDINGS = REPO / "docs" / "findings"
ENV = "KVOFFLOAD_VLLM_DIRS"


def release_dirs() -> list[Path]:
    """The release directories ``KVOFFLOAD_VLLM_DIRS`` names."""
    found: list[Path] = []
    for entry in filter(None, os.environ.get(ENV, "").split(os.pathsep)):
        path = Path(entry)
        if (path / "vllm" / "v1" / "kv_offload").is_dir():
            found.append(path)
        elif path.is_dir():
            found += sorted(
                child for child in path.iterdir() if (child / "vllm" / "v1" / "kv_offload").is_dir()
            )
    return found


def version_of(directory: Path) -> tuple[int, int]:
    for metadata in directory.glob("vllm-*.dist-info/METADATA"):
        found = re.search(r"^Version: (\d+)\.(\d+)", metadata.read_text(), re.M)
        if found:
            return int(found[1]), int(found[2])
    return (0, 0)


DIRS = release_dirs()
needs_release = pytest.mark.skipif(not DIRS, reason=f"set {ENV} to audit real vLLM releases")
params = pytest.mark.parametrize("directory", DIRS, ids=[d.name for d in DIRS])

GENERATION_OF_MINOR = {
    19: "0.19", 20: "0.20", 21: "0.21", 22: "0.22", 23: "0.23", 24: "0.24",
    25: "0.25", 26: "0.25", 27: "0.25", 28: "0.25", 29: "0.29", 30: "0.30",
    31: "0.31", 32: "0.31", 33: "0.33",
}
"""The generation each release 0.19-0.33 has (docs/FINDINGS.md)."""

REPRODUCED_IN: dict[str, tuple[int, int]] = {
    "F1_arc_refuses_store_with_room.py": (19, 29),
    "F2_filter_evicts_offered_key.py": (19, 30),
    "F3_illegal_load_pins_block.py": (19, 33),
    "F4_repeated_key_offer_leaks_slot.py": (19, 33),
    "F5_reset_is_silent.py": (22, 33),
    "F6_filter_counts_first_miss.py": (20, 28),
    "F7_lru_orders_by_release.py": (24, 30),
}
"""Each hand reproduction and the minor releases (0.x) it reproduces in."""


def run(*args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, env=env, cwd=REPO, check=False
    )


@needs_release
@params
def test_generation_detected(directory: Path) -> None:
    code = (
        "import sys; from kvoffload.vllm_release import load_release; "
        "r = load_release(sys.argv[1]); print(r.version, r.generation.value)"
    )
    result = run("-c", code, str(directory))
    assert result.returncode == 0, result.stderr
    version, generation = result.stdout.split()
    major, minor = version_of(directory)
    if major == 0 and minor in GENERATION_OF_MINOR:
        assert generation == GENERATION_OF_MINOR[minor]


@needs_release
@params
@pytest.mark.parametrize("script", sorted(REPRODUCED_IN))
def test_hand_reproduction(directory: Path, script: str) -> None:
    major, minor = version_of(directory)
    if major != 0 or not 19 <= minor <= 33:
        pytest.skip("findings are recorded for 0.19-0.33")
    result = run(str(FINDINGS / script), str(directory))
    low, high = REPRODUCED_IN[script]
    expected = low <= minor <= high
    assert ("REPRODUCED" in result.stdout) == expected, result.stdout + result.stderr
    assert result.returncode == (1 if expected else 0)


def _in(minor: int, span: tuple[int, int]) -> bool:
    return span[0] <= minor <= span[1]


def expected_after_illegal_calls(minor: int) -> dict[str, set[str]]:
    """What each target of ``audit --vllm`` may find once illegal calls are
    set aside (F3 aside), by the findings' releases (docs/FINDINGS.md): F1 is
    ARC's refused store (``5 liveness``); F2 the filter evicting an offered
    key (``2/3/5 eviction``), with a table of 2, and in 0.19 also with the
    default table (its flood of lookups pushes a stored key's count out);
    F6 the filter that counts lookups only to the first miss, which leaves a
    repeated prompt not offloaded (``protocol: repeated prompt``). A filter
    target with both F2 and F6 reports whichever shows first."""
    f1 = _in(minor, REPRODUCED_IN["F1_arc_refuses_store_with_room.py"])
    f2 = _in(minor, REPRODUCED_IN["F2_filter_evicts_offered_key.py"])
    f6 = _in(minor, REPRODUCED_IN["F6_filter_counts_first_miss.py"])
    eviction, prompt = "FAIL: invariant 2/3/5 eviction", "FAIL: invariant protocol: repeated prompt"
    small = {eviction} if f2 else set()
    default = {eviction} if minor == 19 else set()
    if f6:
        small.add(prompt)
        default.add(prompt)
    return {
        "lru": {"PASS"},
        "arc": {"FAIL: invariant 5 liveness" if f1 else "PASS"},
        "filter lru threshold=2 tracker=2": small or {"PASS"},
        "filter lru threshold=2 tracker=": default or {"PASS"},
    }


LINE = re.compile(r"^(PASS|FAIL) (lru|arc|filter lru threshold=2 tracker=\d+)(?:: (.*))? \(\d+ examples")


@needs_release
@params
def test_audit_finds_what_the_findings_say(directory: Path) -> None:
    """``audit --vllm DIR --seed 0``: every target fails (F3 in every
    release, unless F1 or F2 shows first), and what is left once illegal
    calls are set aside is exactly F1 and F2 in their releases: the
    conventions of every release (F4, F5, F7, ...) are its preset's."""
    major, minor = version_of(directory)
    if major != 0 or not 19 <= minor <= 33:
        pytest.skip("findings are recorded for 0.19-0.33")
    result = run("-m", "kvoffload", "audit", "--vllm", str(directory), "--seed", "0")
    assert result.returncode == 1, result.stdout + result.stderr
    found = {m[2]: (m[1], m[3] or "") for m in map(LINE.match, result.stdout.splitlines()) if m}
    assert len(found) == 4, result.stdout
    expected = expected_after_illegal_calls(minor)
    for target, (word, detail) in found.items():
        want = next(
            v for k, v in expected.items() if target == k or (k.endswith("=") and target.startswith(k))
        )
        assert word == "FAIL", target
        # each verdict says which documented finding it matches, and the audit
        # without illegal calls gives its own counts
        finding_ids = re.findall(r" \[(F\d), ", detail)
        assert finding_ids and finding_ids[0] in ("F1", "F2", "F3", "F6"), detail
        detail = re.sub(r" \[[^]]*\]| \(\d+ examples, \d+ steps, [\d.]+ s\)", "", detail)
        if "without illegal calls: " in detail:
            assert detail.startswith("invariant errors (an illegal call changed the manager)")
            after = detail.split("without illegal calls: ", 1)[1]
        else:  # F1 or F2 showed before any damage
            after = "FAIL: " + detail
        assert after in want, f"{target}: {detail}"
