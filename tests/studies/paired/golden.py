"""The tiny studies' numbers from before the protocol moved into its own package
(`golden/README.md`): a re-run must give them again."""

from __future__ import annotations

import copy
import json
import os

import numpy as np

from sera_jax.studies.paired import recompute

GOLDEN = os.path.join(os.path.dirname(__file__), "golden")
#: Fields of the golden comparison that name temporary paths (or hash them), not numbers.
VOLATILE = (("preregistration",), ("validity", "path"))


def check_same_numbers(export_dir: str, name: str) -> None:
    """`export_dir` (an `export_results` folder) holds the golden study `name`'s numbers:
    every array of `counts.npz` bit for bit, every number of `comparison.json` exactly."""
    gold = os.path.join(GOLDEN, name)
    with np.load(os.path.join(gold, "counts.npz")) as a, \
            np.load(os.path.join(export_dir, "counts.npz")) as b:
        assert sorted(a.files) == sorted(b.files)
        for key in a.files:
            assert a[key].dtype == b[key].dtype and np.array_equal(a[key], b[key]), key
    saved = json.load(open(os.path.join(gold, "comparison.json")))
    now = json.load(open(os.path.join(export_dir, "comparison.json")))
    saved = copy.deepcopy(saved)
    for path in VOLATILE:
        parent = saved
        for key in path[:-1]:
            parent = parent.get(key, {})
        parent.pop(path[-1], None)
    # The blind report's prompt count is named for any kind now (was the maze's `num_mazes`).
    assert now["validity"]["num_prompts"] == saved["validity"].pop("num_mazes")
    assert recompute.compare_numbers(now, saved) == []
