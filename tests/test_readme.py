"""The README's five-minute example runs and prints what the README says."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def _section(text: str, heading: str) -> str:
    start = text.index(heading)
    following = text.find("\n## ", start + len(heading))
    return text[start:] if following < 0 else text[start:following]


def test_five_minute_example_prints_what_the_readme_says() -> None:
    section = _section(README.read_text(encoding="utf-8"), "## The API in five minutes")
    code = re.search(r"```python\n(.*?)```", section, re.DOTALL)
    printed = re.search(r"It prints:\n\n```\n(.*?)```", section, re.DOTALL)
    assert code is not None and printed is not None
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code.group(1), str(README), "exec"), {"__name__": "readme"})
    assert out.getvalue() == printed.group(1)
