"""The alignment figure (`make demo`'s PNG): uniform and SERA stand out, the eight peers
recede, and the legend sits below the panels, over no curve."""

import matplotlib.pyplot as plt
import numpy as np

from sera_jax.studies.alignment import report

METHODS = ("uniform", "sera", "sera_equalized", "sera_no_multiplicity", "sera_paper_rounding",
           "inverse_p", "knapsack", "hit_utility", "sera_posterior", "sera_sequential")
STAGES = ("initial", "partly trained", "well trained")
BUDGETS = (2, 4, 8, 16, 32, 64, 128)


def _table():
    """Cosines rising from 0.1 to 1 across the budgets: curves cross every part of each
    panel, the lower right corner included (where the old in-panel legend sat)."""
    rng = np.random.default_rng(0)
    return [{"stage": s, "budget": b, "method": m,
             "cosine": float(min(1.0, 0.1 + 0.9 * i / 6 + 0.05 * rng.standard_normal())),
             "cosine_se": 0.01}
            for s in STAGES for m in METHODS for i, b in enumerate(BUDGETS)]


def test_headline_methods_stand_out_and_the_legend_covers_no_panel():
    fig = report.alignment_figure(_table(), STAGES, METHODS)
    try:
        fig.canvas.draw()
        axes = fig.axes
        assert all(ax.get_legend() is None for ax in axes)  # no legend inside a panel
        assert len(fig.legends) == 1
        legend_box = fig.legends[0].get_window_extent()
        assert not any(legend_box.overlaps(ax.get_window_extent()) for ax in axes)
        assert len(fig.legends[0].get_texts()) == len(METHODS)
        for ax in axes:
            lines = {c.get_label(): c.lines[0] for c in ax.containers}
            assert len(lines) == len(METHODS)
            head = [lines[report.methods_lib.get_method(m).label] for m in ("uniform", "sera")]
            peers = [line for label, line in lines.items() if line not in head]
            assert all(h.get_alpha() == 1.0 for h in head)
            assert min(h.get_linewidth() for h in head) > max(p.get_linewidth() for p in peers)
            assert all(p.get_alpha() < 1.0 for p in peers)
            assert min(h.get_zorder() for h in head) > max(p.get_zorder() for p in peers)
            colours = [tuple(np.round(plt.matplotlib.colors.to_rgba(line.get_color()), 3))
                       for line in lines.values()]
            assert len(set(colours)) == len(colours)  # every method its own colour
    finally:
        plt.close(fig)
