"""Every pointer in the docs resolves inside the repository: markdown links,
and file paths written in backticks (``kvoffload/...``, ``tests/...``,
``docs/...``, ``scripts/...``)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
LINK = re.compile(r"\]\(([^)\s#]+)(?:#[^)]*)?\)")
PATH = re.compile(r"`((?:kvoffload|tests|docs|scripts)/[^`\s]*(?:\{[^}`]*\}[^`\s]*)?)`")


def _candidates(path: str) -> list[str]:
    """``a/{b,c}.py`` names two files; ``a/b.py:NAME`` and ``a/b.py::test``
    name the file."""
    path = re.sub(r"\s+", "", path).split("::")[0].split(":")[0].rstrip(".,")
    brace = re.search(r"\{([^}]*)\}", path)
    if brace is None:
        return [path]
    return [
        path[: brace.start()] + part.strip() + path[brace.end():]
        for part in brace.group(1).split(",")
    ]


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_pointer_resolves(doc: Path) -> None:
    text = doc.read_text(encoding="utf-8")
    missing = []
    for target in LINK.findall(text):
        if "://" in target or target.startswith("mailto:"):
            continue
        if not (doc.parent / target).exists():
            missing.append(target)
    for raw in PATH.findall(text):
        for path in _candidates(raw):
            if "*" in path:
                if not list(ROOT.glob(path)):
                    missing.append(path)
            elif not (ROOT / path).exists():
                missing.append(path)
    assert not missing, f"{doc.name}: {sorted(set(missing))}"
