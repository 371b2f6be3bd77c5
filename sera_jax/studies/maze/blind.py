"""The maze-blind control: a policy that never reads the maze.

It emits answer `a` with the frequency `f_a` that `a` has among the SFT split's answers (the
supervised shortest paths), whatever the prompt. On a maze `m` it therefore succeeds with
probability

    q_m = sum_a f_a * verify(m, a)                       (exact: every distinct answer checked)

and its pass@k on `m` is the closed form `1 - (1 - q_m)^k` — the expectation of the unbiased
pass@k estimator at any sample size, so it sits beside a policy's measured pass@k with no
sampling noise of its own. A task "requires reading the maze" only when a policy that reads
it scores far above this control (`validity`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

import numpy as np

from sera_jax.metrics import analytic_pass_at_k
from sera_jax.tasks import maze as maze_lib

#: Answers verified per call of the batch verifier (rows of one maze's broadcast grid).
_CHUNK = 8192


def answer_distribution(task: maze_lib.MazeTask, split: str = "sft"
                        ) -> tuple[list[tuple[int, ...]], np.ndarray]:
    """(distinct answers as move tuples, their frequencies f_a summing to 1) among the
    shortest paths of `split`, most frequent first (ties in first-seen order)."""
    counts = Counter(tuple(int(t) for t in path) for path in task.solutions(split))
    if not counts:
        raise ValueError(f"split {split!r} has no mazes: the blind control needs its answers")
    answers, n = zip(*counts.most_common())
    freq = np.asarray(n, np.float64)
    return list(answers), freq / freq.sum()


def blind_success(walls: np.ndarray, answers: Sequence[Sequence[int]], freq: np.ndarray
                  ) -> np.ndarray:
    """q_m = sum_a f_a verify(m, a) for each maze of `walls` bool `[M, n, n]`: float64 `[M]`.

    Each answer is verified as the completion `moves + DONE` by the task's own verifier.
    """
    walls = np.asarray(walls, bool)
    freq = np.asarray(freq, np.float64)
    if len(answers) != freq.size:
        raise ValueError(f"{len(answers)} answers but {freq.size} frequencies")
    completions = [np.asarray([*a, maze_lib.DONE], np.int32) for a in answers]
    tokens, lengths = maze_lib.pad_completions(completions)
    q = np.zeros(walls.shape[0], np.float64)
    for m in range(walls.shape[0]):
        for lo in range(0, len(completions), _CHUNK):
            hi = lo + _CHUNK
            reward = maze_lib.walk(walls[m], tokens[lo:hi], lengths[lo:hi])["reward"]
            q[m] += float(np.dot(reward.astype(np.float64), freq[lo:hi]))
    return np.clip(q, 0.0, 1.0)


def blind_pass_at_k(q: np.ndarray, ks: Sequence[int]) -> dict[str, float]:
    """Mean over mazes of the blind policy's exact pass@k, `1 - (1 - q_m)^k`, keyed like the
    study's pass@k records (`str(k)`)."""
    q = np.asarray(q, np.float64)
    return {str(int(k)): float(np.mean(analytic_pass_at_k(q, int(k)))) for k in ks}


def task_validity(task: maze_lib.MazeTask, split: str, num_prompts: int,
                  ks: Sequence[int]) -> dict[str, Any]:
    """What a maze-blind guesser gets on the first `num_prompts` mazes of `split`:

    * `blind_pass_at_k` (exact, `blind_pass_at_k`) and the per-maze `blind_q`;
    * `distinct_answers` among those mazes and among the SFT answers;
    * `seen_in_sft`: the share of those mazes whose shortest path is also an SFT answer;
    * `median_moves`: the median length of their shortest paths.
    """
    answers, freq = answer_distribution(task, "sft")
    n = min(int(num_prompts), task.split_size(split))
    walls = task.walls(split, np.arange(n))
    q = blind_success(walls, answers, freq)
    paths = [tuple(int(t) for t in p) for p in task.solutions(split)[:n]]
    sft = set(answers)
    return {"split": split, "num_mazes": n, "size": task.size,
            "blind_pass_at_k": blind_pass_at_k(q, ks),
            "blind_q": q.tolist(),
            "distinct_answers": len(set(paths)), "distinct_sft_answers": len(answers),
            "seen_in_sft": float(np.mean([p in sft for p in paths])) if paths else 0.0,
            "median_moves": float(np.median([len(p) for p in paths])) if paths else 0.0}
