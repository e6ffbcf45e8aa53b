"""Test-wide set-up: the kit's Hypothesis profiles.

``HYPOTHESIS_PROFILE`` selects one (``ci`` in CI, ``dev`` by default).
"""

from __future__ import annotations

import os

from hypothesis import settings

from kvoffload.stateful.profiles import register_profiles

register_profiles()
# Audits not given a seed draw a fresh one; the suite repeats itself.
os.environ.setdefault("KVOFFLOAD_AUDIT_SEED", "20261121")
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "dev"))
