"""Hit ratio against capacity, one line per policy (needs matplotlib)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from kvoffload.sim.result import SimResult
from kvoffload.spec.errors import OffloadingError


class PlotUnavailableError(OffloadingError, ImportError):
    """matplotlib is not installed (``pip install 'kvoffload[plot]'``)."""


def plot_hit_ratios(
    results: Sequence[SimResult], path: str | Path, title: str = ""
) -> Path:
    """Draw hit ratio against capacity for each policy into ``path`` (PNG,
    SVG… by extension) and return it.

    Raises :class:`PlotUnavailableError` when matplotlib is missing.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise PlotUnavailableError(
            "--plot needs matplotlib: pip install 'kvoffload[plot]' (or matplotlib)"
        ) from None
    by_policy: dict[str, list[SimResult]] = {}
    for result in results:
        by_policy.setdefault(result.policy, []).append(result)
    figure, axes = plt.subplots(figsize=(6.4, 4.0), dpi=100)
    for policy, rows in by_policy.items():
        rows = sorted(rows, key=lambda row: row.capacity)
        style = "k--" if policy == "opt" else "-o"
        axes.plot(
            [row.capacity for row in rows],
            [row.hit_ratio for row in rows],
            style,
            label=policy,
            markersize=4,
        )
    axes.set_xscale("log", base=2)
    axes.set_xlabel("capacity (blocks)")
    axes.set_ylabel("prefix hit ratio")
    axes.set_ylim(bottom=0)
    axes.grid(True, alpha=0.3)
    axes.legend()
    if title:
        axes.set_title(title)
    figure.tight_layout()
    out = Path(path)
    figure.savefig(out)
    plt.close(figure)
    return out
