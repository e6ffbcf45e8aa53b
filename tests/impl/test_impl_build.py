"""The two builds: which one is imported, the compiled module list, and
downstream type checking of the installed package."""

from __future__ import annotations

import ast
import importlib.metadata
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from kvoffload.impl.build import COMPILED_MODULES, build_name, compiled_modules

ROOT = Path(__file__).resolve().parents[2]


def test_setup_compiles_exactly_the_listed_modules() -> None:
    setup = ROOT / "setup.py"
    if not setup.is_file():
        pytest.skip("no source tree (tests run against an installed package)")
    tree = ast.parse(setup.read_text(encoding="utf-8"))
    listed = next(
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Assign)
        and any(isinstance(t, ast.Name) and t.id == "COMPILED_MODULES" for t in node.targets)
    )
    paths = ast.literal_eval(listed)
    assert [p.removesuffix(".py").replace("/", ".") for p in paths] == list(COMPILED_MODULES)


def test_build_name_says_which_build_is_imported() -> None:
    name = build_name()
    assert name in ("compiled", "pure")  # never a mix of the two
    assert (name == "compiled") == (compiled_modules() == list(COMPILED_MODULES))
    expected = os.environ.get("KVOFFLOAD_EXPECT_BUILD")
    if expected:
        assert name == expected


def test_both_builds_reject_a_bool_size() -> None:
    # mypyc converts True to the int 1 at a typed boundary; the public
    # constructors take their sizes untyped for the compiler and check them
    from kvoffload import ConfigurationError, CPUOffloadingManager

    with pytest.raises(ConfigurationError):
        CPUOffloadingManager(True, 4)


DOWNSTREAM = textwrap.dedent(
    """
    from kvoffload import CPUOffloadingManager, ReqContext, make_offload_key

    manager = CPUOffloadingManager(16, 8, "arc")
    hits: int = manager.lookup_prefix([make_offload_key(b"h", 0)], ReqContext("r"))
    wrong: str = manager.lookup_prefix([], ReqContext("r"))
    """
)


def _installed() -> bool:
    """Whether kvoffload is pip-installed (metadata in the source tree itself,
    left by a build, does not count)."""
    return any(
        Path(str(found.locate_file(""))).resolve() != ROOT
        for found in importlib.metadata.distributions(name="kvoffload")
    )


@pytest.mark.skipif(not _installed(), reason="kvoffload is not pip-installed here")
def test_downstream_mypy_sees_the_installed_types(tmp_path: Path) -> None:
    """A project that imports kvoffload type-checks against its real types
    (an editable install included): the one deliberate error is found."""
    (tmp_path / "downstream.py").write_text(DOWNSTREAM, encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "MYPYPATH")}
    result = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-incremental",
         "--config-file=", "downstream.py"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600,
    )
    output = result.stdout + result.stderr
    assert "Cannot find implementation or library stub" not in output, output
    assert 'Incompatible types in assignment (expression has type "int"' in output, output
    assert "Found 1 error in 1 file" in output, output


def test_the_compiled_build_has_the_file_tiers_c_io() -> None:
    """The compiled build carries ``_chunkio`` (POSIX); the pure one runs
    the file tier's I/O in Python."""
    from kvoffload.impl import fs_tier

    expected = os.environ.get("KVOFFLOAD_EXPECT_BUILD")
    if not expected:
        pytest.skip("KVOFFLOAD_EXPECT_BUILD is not set (scripts/test.sh sets it)")
    assert fs_tier.COMPILED_IO == (expected == "compiled" and os.name == "posix")
