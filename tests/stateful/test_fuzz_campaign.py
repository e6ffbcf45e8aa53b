"""A HypoFuzz campaign runs, briefly, on a built-in target and on a user's
backend, and saves what it explores into the shared example database.

Skipped where HypoFuzz is not installed (``pip install 'kvoffload[fuzz]'``).
"""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("hypofuzz") is None, reason="HypoFuzz not installed"
)

REPO = Path(__file__).resolve().parents[2]
CAMPAIGN_SECONDS = 12.0


def _fuzz_briefly(pytest_args: list[str], database: Path, cwd: Path) -> str:
    """Run ``hypothesis fuzz`` on one process for a few seconds, then stop it
    (a campaign never ends by itself); return what it printed."""
    env = dict(os.environ, KVOFFLOAD_FUZZ_DB=str(database))
    env["PYTHONPATH"] = os.pathsep.join(
        [str(REPO), str(cwd), env.get("PYTHONPATH", "")]
    )
    command = [
        sys.executable, "-c", "from hypothesis.extra.cli import main; main()",
        "fuzz", "-n", "1", "--no-dashboard", "--", *pytest_args,
    ]
    process = subprocess.Popen(
        command, cwd=cwd, env=env, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True, start_new_session=True,
    )
    deadline = time.monotonic() + CAMPAIGN_SECONDS
    while time.monotonic() < deadline and process.poll() is None:
        time.sleep(0.5)
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
    output, _ = process.communicate(timeout=30)
    return output


def _saved_entries(database: Path) -> int:
    return sum(1 for path in database.rglob("*") if path.is_file())


def test_campaign_on_a_builtin_target(tmp_path: Path) -> None:
    database = tmp_path / "db"
    output = _fuzz_briefly(
        ["--pyargs", "kvoffload.stateful.fuzz", "-k", "CPUOffloadingManagerArc and not Any"],
        database, tmp_path,
    )
    assert "using 1 process to fuzz 1 test" in output, output
    assert _saved_entries(database) > 0, output


def test_campaign_on_a_users_backend(tmp_path: Path) -> None:
    (tmp_path / "test_my_backend.py").write_text(textwrap.dedent("""
        from kvoffload import CPUOffloadingManager
        from kvoffload.stateful import machine_test_case
        from kvoffload.stateful.fuzz import use_shared_database

        use_shared_database()

        def make_manager(num_blocks):
            return CPUOffloadingManager(16, num_blocks, "lru", enable_events=True)

        TestMyBackend = machine_test_case(make_manager, policy="any")
    """))
    database = tmp_path / "shared-db"
    output = _fuzz_briefly(["test_my_backend.py"], database, tmp_path)
    assert "using 1 process to fuzz 1 test" in output, output
    assert _saved_entries(database) > 0, output
