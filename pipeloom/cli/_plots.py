"""The pictures of a profile: a PNG timeline (matplotlib), the placement graph (graphviz)."""

from __future__ import annotations

import shutil
import subprocess
import textwrap

from ..graph import Placement
from ..stats import LoaderStats

__all__ = ["write_placement_graph", "write_timeline"]

_TOP_STAGES = 6  # stages drawn by name; the rest are summed as "other"
_QUEUES = 6  # queues drawn, those to the main process first


def write_timeline(stats: LoaderStats, path: str) -> str:
    """Draw throughput, readiness and each stage's share of busy time per window.

    Returns a line saying what was written, or why nothing was (no matplotlib).
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "timeline: not drawn (matplotlib is not installed: pip install 'pipeloom[cli]')"
    points = stats.timeline
    times = [p.start_s for p in points]
    figure, (top, bottom, lane) = plt.subplots(
        3, 1, figsize=(8, 7), sharex=True, gridspec_kw={"height_ratios": [2, 2, 1.4]}
    )
    top.step(times, [p.outputs_per_s for p in points], where="post", label="outputs/s")
    top.set_ylabel("outputs/s")
    if stats.readiness is not None:
        ready = top.twinx()
        ready.step(
            times,
            [100 * (p.readiness or 0.0) for p in points],
            where="post",
            color="tab:green",
            label="ready %",
        )
        ready.set_ylim(0, 105)
        ready.set_ylabel("next() ready (%)")
        ready.legend(loc="lower right", fontsize=7)
    top.legend(loc="lower left", fontsize=7)
    title = textwrap.fill(f"{stats.service}, {stats.workers} worker(s): {stats.verdict}", 110)
    top.set_title(title, fontsize=7)
    names = [f"{s.stage} ({s.placement})" for s in stats.stages if s.busy_s > 0][:_TOP_STAGES]
    shares = [[p.busy.get(name, 0.0) for p in points] for name in names]
    other = [
        max(0.0, 1.0 - sum(p.busy.get(n, 0.0) for n in names)) if p.busy else 0.0 for p in points
    ]
    bottom.stackplot(times, *shares, other, labels=[*names, "other"], step="post")
    bottom.set_ylabel("share of busy samples")
    bottom.legend(fontsize=6, loc="upper right")
    queues = sorted(stats.queues, key=lambda q: not q.name.endswith("-> main"))[:_QUEUES]
    for queue in queues:
        if queue.timeline:
            at, fill = zip(*queue.timeline, strict=True)
            lane.step(at, [100 * f for f in fill], where="post", label=queue.name)
    lane.set_ylim(0, 105)
    lane.set_ylabel("queue fill (%)")
    lane.set_xlabel("seconds")
    if queues:
        lane.legend(fontsize=6, loc="upper right")
    else:
        lane.text(0.5, 0.5, "no queues (in-process)", ha="center", transform=lane.transAxes)
    figure.tight_layout()
    figure.savefig(path, dpi=80)
    plt.close(figure)
    return f"timeline: {path}"


def write_placement_graph(placement: Placement, stem: str) -> str:
    """Write ``stem.dot`` and, with graphviz's ``dot`` installed, ``stem.svg``."""
    with open(stem + ".dot", "w") as f:
        f.write(placement.to_dot())
    dot = shutil.which("dot")
    if dot is None:
        return (
            f"placement graph: {stem}.dot (graphviz's 'dot' is not installed, so no SVG; "
            f"install graphviz, or render the .dot file elsewhere)"
        )
    subprocess.run([dot, "-Tsvg", stem + ".dot", "-o", stem + ".svg"], check=True, timeout=60)
    return f"placement graph: {stem}.svg"
