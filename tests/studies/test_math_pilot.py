"""The math pilot's candidates (experiments/math_pilot.py): each is a valid study task with
disjoint train / held-out splits of the largest size its templates supply."""

import os

import pytest

from sera_jax import config_files
from sera_jax.studies import math_pilot
from sera_jax.studies import math_reasoning as mr
from sera_jax.tasks.mathqa import problems
from sera_jax.tasks.mathqa import task as math_task

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.parametrize("name", list(math_pilot.CANDIDATES))
def test_candidate_is_a_valid_task_with_disjoint_splits(name):
    cfg = config_files.get_config(os.path.join(ROOT, "configs", "math", "cpu.py"))
    c = math_pilot.candidate_config(cfg, name)
    mr.validate_task(c)
    assert (c.eval.temperature, c.eval.top_p) == (c.rl.sampling.temperature,
                                                  c.rl.sampling.top_p)
    splits = math_task.load_splits(c.task)
    size = 96 if c.task.templates == "add,mul" else 128  # add/mul has ~110 held-out contents
    assert len(splits["train"]) == len(splits["eval"]) == size
    keys = {s: {problems.content_key(p.meta["template"], p.meta["operands"]) for p in ps}
            for s, ps in splits.items()}
    assert not keys["train"] & keys["eval"]
    assert {p.level for ps in splits.values() for p in ps} <= set(c.task.steps)
