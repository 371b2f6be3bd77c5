"""Adding a task kind is one module: a toy kind registered here (a maze whose reports speak
of puzzles and whose blind guesser is uniform over the SFT answers) runs the protocol with no
change to it, its words in the tables and its name in the results folder."""

import os

import numpy as np
import pytest

from sera_jax import config_files
from sera_jax.studies import common
from sera_jax.studies.paired import kinds, spec, study, tables
from sera_jax.studies.paired.kinds import base
from sera_jax.studies.paired.kinds.maze import MazeKind, answer_distribution, blind_success
from tests import util

TOY_WORDS = base.Words(prompt="puzzle", prompts="puzzles", start="warm-up",
                       start_long="warm-up start", start_row="warm-up (step-{step} keys)",
                       blind="puzzle-blind",
                       blind_policy="a policy that ignores the puzzle and picks any SFT answer "
                                    "uniformly", blind_note="any SFT answer, uniformly",
                       reads="reads the puzzle", seen="in SFT", published="published puzzles")


class ToyKind(MazeKind):
    """A kind in a few lines: the maze task, other words, another blind control."""

    name = "toy"
    words = TOY_WORDS

    def blind_validity(self, task, split, num_prompts, ks):
        answers, freq = answer_distribution(task, "sft")
        n = min(int(num_prompts), task.split_size(split))
        q = blind_success(task.walls(split, np.arange(n)), answers,
                          np.full(len(answers), 1.0 / len(answers)))
        return {"split": split, "kind": self.name, "num_prompts": n, "size": task.size,
                "blind_pass_at_k": base.blind_pass_at_k(q, ks), "blind_q": q.tolist(),
                "distinct_answers": len(answers), "distinct_sft_answers": len(answers),
                "seen_in_sft": 1.0}


@pytest.fixture
def toy():
    base.register(ToyKind)
    yield kinds.get_kind("toy")
    del base.KINDS["toy"]


def _tiny_toy():
    cfg = config_files.get_config(os.path.join(util.ROOT, "configs", "maze", "tiny.py"))
    cfg.kind = "toy"
    cfg.name = "toy_tiny"
    cfg.compare.methods, cfg.compare.seeds = ("uniform", "sera"), (0,)
    cfg.compare.aa = False
    cfg.rl.num_steps = 1
    cfg.eval.every = 1
    cfg.compare.primary.window = 1
    return cfg


def test_registry_names_every_kind_and_refuses_unknown_and_duplicate_names(toy):
    assert {"maze", "math", "toy"} <= set(kinds.KINDS)
    cfg = _tiny_toy()
    assert kinds.get_kind(cfg) is toy and kinds.get_kind("maze").name == "maze"
    assert spec.results_dir(cfg).endswith(os.path.join("results", "toy", "toy_tiny"))
    with pytest.raises(ValueError, match="new, non-empty name"):
        base.register(ToyKind)
    cfg.kind = "sudoku"
    with pytest.raises(common.StudyError, match=r"config.kind='sudoku'; choose from"):
        study.run(cfg, "/nonexistent", "sft")


def test_configs_without_a_kind_field_resolve_by_their_model_block():
    cfg = config_files.get_config(os.path.join(util.ROOT, "configs", "maze", "tiny.py"))
    del cfg["kind"]
    assert kinds.kind_name(cfg) == "maze"
    cfg.model.source = "embedded"
    assert kinds.kind_name(cfg) == "math"


def test_a_toy_kind_runs_the_protocol_unchanged(toy, tmp_path):
    cfg = _tiny_toy()
    table = study.run(cfg, str(tmp_path), "all")
    assert table["study"] == "toy" and table["exploratory"]
    validity = table["validity"]
    assert validity["num_prompts"] == cfg.eval.num_prompts
    assert "held-out 5x5 puzzles" in validity["line"]
    md = tables.comparison_markdown(table)
    assert "puzzle-blind guesser" in md and "| warm-up (step-1 keys) |" in md
    assert "maze" not in md.lower() and "SFT (" not in md
