"""``python -m kvoffload audit``: bad usage is a usage error (exit 2, no
traceback), and each target reports its progress on stderr."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from kvoffload.__main__ import main
from kvoffload.stateful.audit_cli import Progress, positive_int


@pytest.mark.parametrize("option", ["--steps", "--examples"])
@pytest.mark.parametrize("value", ["0", "-3", "x"])
def test_non_positive_budget_is_a_usage_error(
    option: str, value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["audit", option, value])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1  # one line, no usage block, no traceback
    assert err.startswith("python -m kvoffload audit: error: ")
    assert f"argument {option}:" in err


def test_positive_int_accepts_one() -> None:
    assert positive_int("1") == 1


@pytest.mark.parametrize(
    ("target", "reason"),
    [
        ("os:getcwd", "is not a factory"),
        ("builtins:str", "not an offloading manager"),
        ("builtins:len", "raised TypeError"),
        ("kvoffload.stateful.targets:no_such_thing", "has no attribute"),
        ("no_such_module_here:factory", "cannot import"),
    ],
)
def test_target_that_is_not_a_factory_is_a_usage_error(
    target: str, reason: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["audit", "--target", target, "--examples", "1"]) == 2
    captured = capsys.readouterr()
    assert reason in captured.err
    assert "FAIL" not in captured.out
    assert "no crash" not in captured.out + captured.err


def test_vllm_dir_without_release_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["audit", "--vllm", str(tmp_path)]) == 2
    assert "holds no vLLM release" in capsys.readouterr().err


def test_vllm_and_target_exclude_each_other(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(
        ["audit", "--vllm", "somewhere", "--target", "kvoffload.stateful.targets:cpu_lru"]
    )
    assert code == 2
    assert "exclude each other" in capsys.readouterr().err


def test_progress_per_target_on_stderr(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(
        [
            "audit",
            "--target",
            "kvoffload.stateful.targets:cpu_lru",
            "--policy",
            "lru",
            "--examples",
            "3",
            "--steps",
            "5",
        ]
    )
    assert code == 0
    captured = capsys.readouterr()
    assert "kvoffload.stateful.targets:cpu_lru [lru]: 3/3 examples" in captured.err
    assert captured.err.rstrip().endswith(": ok")
    assert "examples" not in captured.out.splitlines()[0]


def test_progress_lines_while_running() -> None:
    stream = io.StringIO()
    progress = Progress("lru", budget=2, stream=stream, every=0.0)

    def factory(num_blocks: int) -> object:
        return num_blocks

    counted = progress.wrap(factory)  # type: ignore[arg-type]
    counted(1)
    counted(1)
    counted(1)  # beyond the budget: a failure is being shrunk
    progress.done("FAIL (5 liveness)")
    lines = stream.getvalue().splitlines()
    assert lines[0].startswith("  lru: 1/2 examples")
    assert lines[1].startswith("  lru: 2/2 examples")
    assert "shrinking (1 replays)" in lines[2]
    assert lines[-1].endswith(": FAIL (5 liveness)")


@pytest.mark.parametrize("option", ["--target", "--tier"])
def test_a_module_that_fails_on_import_is_a_usage_error(
    option: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    (tmp_path / "broken_backend_mod.py").write_text("def factory(:\n")  # a SyntaxError
    (tmp_path / "raising_backend_mod.py").write_text("raise RuntimeError('no GPU here')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    for module, why in (("broken_backend_mod", "SyntaxError"),
                        ("raising_backend_mod", "RuntimeError: no GPU here")):
        assert main(["audit", option, f"{module}:factory", "--examples", "1"]) == 2
        err = capsys.readouterr().err
        assert f"cannot import '{module}'" in err and why in err
        assert "Traceback" not in err
