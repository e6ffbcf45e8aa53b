"""Every vLLM release 0.19-0.33 has a preset under its own name, equal (but
for the name) to its generation's; an unknown name lists the valid ones."""

from __future__ import annotations

import attrs
import pytest

from kvoffload.spec.profile import preset_names, profile_named
from kvoffload.spec.releases import GENERATION_PRESETS, preset_for_generation
from kvoffload.stateful.audit_cli import main

GENERATION = {19: "0.19", 20: "0.20", 21: "0.21", 22: "0.22", 23: "0.23", 24: "0.24",
              25: "0.25", 26: "0.25", 27: "0.25", 28: "0.25", 29: "0.29", 30: "0.30",
              31: "0.31", 32: "0.31", 33: "0.33"}


@pytest.mark.parametrize("minor", range(19, 34))
def test_every_release_has_a_preset(minor: int) -> None:
    profile = profile_named(f"vllm-0.{minor}")
    generation = preset_for_generation(GENERATION[minor])
    assert profile.name == f"vllm-0.{minor}"
    assert attrs.evolve(profile, name=generation.name) == generation
    assert generation in GENERATION_PRESETS


def test_an_unknown_profile_lists_the_valid_ones(capsys: pytest.CaptureFixture[str]) -> None:
    status = main(["--target", "tests.stateful.replay_twins:correct", "--profile", "vllm-0.34"])
    assert status == 2
    err = capsys.readouterr().err
    assert "no profile named 'vllm-0.34'" in err
    for name in preset_names():
        assert name in err
