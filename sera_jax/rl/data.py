"""Data order of on-policy RL: epochs are permutations fixed by (seed, epoch), read in order."""

from __future__ import annotations

import numpy as np


def epoch_permutation(seed: int, epoch: int, num_prompts: int) -> np.ndarray:
    """The prompt order of `epoch`: a permutation of 0..num_prompts-1 fixed by (seed, epoch).

    Host NumPy (`default_rng([seed, epoch])`), so every process and every resumed run gets
    the same order without communication.
    """
    return np.random.default_rng([int(seed), int(epoch)]).permutation(num_prompts)


def next_prompt_ids(
    seed: int, num_prompts: int, batch: int, epoch: int, cursor: int
) -> tuple[np.ndarray, int, int, int]:
    """The next `batch` prompt ids from data position (epoch, cursor).

    Returns `(ids, epoch, cursor, epochs_started)`. A batch that reaches the end of the
    epoch's order continues with the next epoch's permutation (so no prompt is skipped and
    every epoch visits every prompt exactly once); `epochs_started` counts the epoch
    boundaries crossed *before* the batch's last prompt (the trainer calls
    `history.start_epoch` that many times before allocating).
    """
    if not 1 <= batch <= num_prompts:
        raise ValueError(f"prompts_per_step={batch} must be in [1, split size={num_prompts}]")
    ids, started = [], 0
    while len(ids) < batch:
        if cursor >= num_prompts:
            epoch, cursor, started = epoch + 1, 0, started + 1
        take = min(batch - len(ids), num_prompts - cursor)
        ids.extend(epoch_permutation(seed, epoch, num_prompts)[cursor : cursor + take].tolist())
        cursor += take
    return np.asarray(ids, np.int32), epoch, cursor, started
