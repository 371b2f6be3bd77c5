"""The maze-blind control: closed-form pass@k against brute-force enumeration."""

import itertools

import numpy as np
import pytest

from sera_jax.studies.paired.kinds import maze
from sera_jax.tasks import maze as maze_lib


@pytest.fixture(scope="module")
def task():
    # 7x7: few enough distinct answers that every k-tuple of guesses can be enumerated.
    return maze_lib.MazeTask(7, num_train=4, num_eval=6, num_sft=40, seed=3)


def test_answer_distribution_is_the_sft_frequency(task):
    answers, freq = maze.answer_distribution(task)
    paths = [tuple(int(t) for t in p) for p in task.solutions("sft")]
    assert freq.sum() == pytest.approx(1.0)
    for a, f in zip(answers, freq):
        assert f == pytest.approx(paths.count(a) / len(paths))
    assert list(freq) == sorted(freq, reverse=True)


@pytest.mark.parametrize("k", [1, 2, 3])
def test_blind_pass_at_k_equals_enumeration(task, k):
    answers, freq = maze.answer_distribution(task)
    walls = task.walls("eval")
    exact = maze.blind_pass_at_k(maze.blind_success(walls, answers, freq), [k])[str(k)]
    # Every ordered k-tuple of guesses with its probability; success = any guess verifies.
    per_maze = []
    for w in walls:
        ok = maze_lib.verify(np.broadcast_to(w, (len(answers), *w.shape)),
                             [np.asarray([*a, maze_lib.DONE]) for a in answers]) > 0
        total = 0.0
        for combo in itertools.product(range(len(answers)), repeat=k):
            if any(ok[i] for i in combo):
                total += float(np.prod(freq[list(combo)]))
        per_maze.append(total)
    assert exact == pytest.approx(float(np.mean(per_maze)), abs=1e-12)
    assert 0.0 < exact < 1.0  # the tiny set is neither trivial nor impossible


def test_task_validity_counts(task):
    r = maze.task_validity(task, "eval", 6, [1, 4])
    paths = {tuple(int(t) for t in p) for p in task.solutions("eval")}
    assert r["distinct_answers"] == len(paths)
    assert r["num_prompts"] == 6 and len(r["blind_q"]) == 6
    assert r["blind_pass_at_k"]["4"] >= r["blind_pass_at_k"]["1"]


def test_nine_by_nine_default_is_guessable():
    # The issue-37 finding, recomputed: 9x9 Prim's mazes at the old default's splits.
    task = maze_lib.MazeTask(9, num_train=256, num_eval=128, num_sft=4000, seed=0)
    r = maze.task_validity(task, "eval", 128, [1, 64])
    assert r["blind_pass_at_k"]["1"] == pytest.approx(0.0427, abs=5e-4)
    assert r["blind_pass_at_k"]["64"] == pytest.approx(0.869, abs=1e-3)
