"""``bench transfer`` without torch says how to get the right build."""

from __future__ import annotations

import builtins
from typing import Any

import pytest

from kvoffload.__main__ import main


def test_without_torch_it_names_both_builds(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    real_import = builtins.__import__

    def no_torch(name: str, *args: Any, **kwargs: Any) -> Any:
        if name == "torch" or name.startswith("torch."):
            raise ImportError("No module named 'torch'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_torch)
    assert main(["bench", "transfer"]) == 2
    advice = capsys.readouterr().err
    assert "--index-url https://download.pytorch.org/whl/cpu" in advice
    assert "CUDA build" in advice and "pip install torch==2.13.0" in advice
