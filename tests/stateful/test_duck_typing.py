"""A backend that subclasses nothing of kvoffload is accepted by ``audit``,
``conformance_test`` and ``machine_test_case`` (``ManagerProtocol``): its
module, one-liners included, passes ``mypy --strict``, and it passes the
audit; a factory whose manager lacks a contract method does not type-check."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from kvoffload.stateful import audit
from tests.stateful.duck_backend import Context, make_duck

REPO_ROOT = Path(__file__).resolve().parents[2]


def mypy(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-incremental", "--follow-imports=silent",
         str(path)],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=240, check=False,
    )


def test_a_duck_typed_backend_type_checks_at_the_one_liner(tmp_path: Path) -> None:
    checked = mypy(REPO_ROOT / "tests" / "stateful" / "duck_backend.py")
    assert checked.returncode == 0, checked.stdout + checked.stderr

    broken = tmp_path / "broken_backend.py"
    source = (REPO_ROOT / "tests" / "stateful" / "duck_backend.py").read_text()
    broken.write_text(source.replace("    def take_events(self)", "    def take_events_(self)"))
    rejected = mypy(broken)
    assert rejected.returncode == 1 and "ManagerProtocol" in rejected.stdout, rejected.stdout


def test_the_duck_typed_backend_passes_the_audit() -> None:
    report = audit(make_duck, policy="lru", context_factory=Context, typed_errors=False,
                   seed=1, max_examples=150)
    assert report.passed, report.render()
