"""DAPO dynamic sampling: over-sample, drop groups whose rewards are all equal, refill.

DAPO (Yu et al., 2025, §3.2) keeps drawing prompt batches until the training batch holds
enough *informative* groups — groups with 0 < K_q < N_q successes; an all-0 or all-1 group
has zero advantage under every group-relative estimator, so it only dilutes the batch. The
price is generation: the rollouts of the dropped groups were generated too. Comparisons at
matched cost therefore count *generated* rollouts and tokens (`Selection.generated_*`), not
the rows that reach the loss.

Combining with SERA is "allocate, then filter": each round allocates its prompts' counts
(any `sera_jax.methods` allocator), generates, and only then drops the all-equal groups.
With ragged counts the kept groups are packed first-fit, in draw order, into the fixed
`batch_rows`; rows left over (fewer than the next group needs) are padding rows with
weight 0, so shapes never change.

Everything here is host NumPy on per-round outcomes; generation is the caller's
(`sera_jax.integrations.tunix` runs it through tunix's rollout engine).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import numpy as np

#: The smallest group that can be informative (one success and one failure).
MIN_INFORMATIVE_GROUP = 2


@dataclasses.dataclass(frozen=True)
class Round:
    """One generation round: rollout r belongs to group `segment_ids[r]` in [0, num_groups)
    of this round, earned `rewards[r]` and generated `num_tokens[r]` tokens."""

    segment_ids: np.ndarray  # int [R]
    rewards: np.ndarray  # float [R]
    num_tokens: np.ndarray  # int [R]
    num_groups: int

    def __post_init__(self):
        seg, rew, tok = (np.asarray(x) for x in (self.segment_ids, self.rewards,
                                                  self.num_tokens))
        if not (seg.ndim == rew.ndim == tok.ndim == 1 and seg.shape == rew.shape == tok.shape):
            raise ValueError("segment_ids, rewards and num_tokens must be 1-D of one length; got "
                             f"{seg.shape}, {rew.shape}, {tok.shape}")
        if seg.size and (seg.min() < 0 or seg.max() >= self.num_groups):
            raise ValueError(f"segment_ids must lie in [0, num_groups={self.num_groups})")
        if not np.all(np.isfinite(rew)):
            raise ValueError("rewards contain NaN or inf")


def informative_groups(segment_ids: np.ndarray, rewards: np.ndarray,
                       num_groups: int) -> np.ndarray:
    """bool [num_groups]: the group's rewards are not all equal (binary: 0 < K_q < N_q).

    Empty groups (N_q = 0, e.g. prompts SERA left inactive) are not informative.
    """
    seg = np.asarray(segment_ids)
    rew = np.asarray(rewards, np.float64)
    lo = np.full(num_groups, np.inf)
    hi = np.full(num_groups, -np.inf)
    np.minimum.at(lo, seg, rew)
    np.maximum.at(hi, seg, rew)
    return hi > lo


@dataclasses.dataclass(frozen=True)
class Selection:
    """The filled batch: `batch_rows` rows taken from the concatenated rounds.

    rows[b]: index into the rounds' rows concatenated in draw order; keep[b] False marks a
    padding row (weight 0); group[b]: the kept group of row b, numbered 0..num_kept−1 in
    draw order (padding rows repeat the last kept group's id, or 0 with none kept).
    """

    rows: np.ndarray  # int [batch_rows]
    keep: np.ndarray  # bool [batch_rows]
    group: np.ndarray  # int [batch_rows]
    num_kept: int  # informative groups in the batch
    num_dropped: int  # generated groups left out (all-equal, or no room)
    generated_rollouts: int  # every rollout generated, kept or not
    generated_tokens: int
    rounds: int

    @property
    def padding_rows(self) -> int:
        return int(np.sum(~self.keep))

    def filled(self, min_group: int = MIN_INFORMATIVE_GROUP) -> bool:
        """Fewer padding rows than `min_group`, the smallest group a round can produce (N0
        for uniform counts, max(n_min, 2) for an allocator): no further group could fit."""
        return self.padding_rows < max(int(min_group), 1)


def select(rounds: Sequence[Round], batch_rows: int) -> Selection:
    """Pack the informative groups of `rounds`, first-fit in draw order, into `batch_rows`.

    A group is kept whole or not at all; a group larger than the room left is skipped (a
    later, smaller one may still fit). Rows of a kept group stay contiguous.
    """
    if isinstance(batch_rows, bool) or not isinstance(batch_rows, int | np.integer) \
            or batch_rows < 1:
        raise ValueError(f"batch_rows={batch_rows!r} must be an integer >= 1")
    rows, group = [], []
    kept = dropped = generated = tokens = offset = 0
    for rnd in rounds:
        seg = np.asarray(rnd.segment_ids)
        generated += seg.size
        tokens += int(np.sum(rnd.num_tokens))
        good = informative_groups(seg, rnd.rewards, rnd.num_groups)
        counts = np.bincount(seg, minlength=rnd.num_groups)
        for q in range(rnd.num_groups):
            if counts[q] == 0:
                continue
            if not good[q] or len(rows) + counts[q] > batch_rows:
                dropped += 1
                continue
            rows.extend((offset + np.flatnonzero(seg == q)).tolist())
            group.extend([kept] * int(counts[q]))
            kept += 1
        offset += seg.size
    pad = batch_rows - len(rows)
    keep = np.r_[np.ones(len(rows), bool), np.zeros(pad, bool)]
    rows = np.r_[np.asarray(rows, np.int64), np.full(pad, rows[-1] if rows else 0, np.int64)]
    group = np.r_[np.asarray(group, np.int64), np.full(pad, max(kept - 1, 0), np.int64)]
    return Selection(rows, keep, group, kept, dropped, generated, tokens, len(rounds))


def fill(draw: Callable[[int], Round], batch_rows: int, max_rounds: int,
         min_group: int = MIN_INFORMATIVE_GROUP) -> tuple[list[Round], Selection]:
    """Call `draw(i)` for rounds i = 0, 1, ... until the selection is `filled(min_group)` or
    `max_rounds` rounds were drawn; returns the rounds and their `select`ion.

    With max_rounds = 1 this is plain filtering (DAPO without refill): all-equal groups
    become padding rows.
    """
    if isinstance(max_rounds, bool) or not isinstance(max_rounds, int) or max_rounds < 1:
        raise ValueError(f"max_rounds={max_rounds!r} must be an integer >= 1")
    rounds: list[Round] = []
    while True:
        rounds.append(draw(len(rounds)))
        chosen = select(rounds, batch_rows)
        if chosen.filled(min_group) or len(rounds) >= max_rounds:
            return rounds, chosen


__all__ = ["MIN_INFORMATIVE_GROUP", "Round", "Selection", "fill", "informative_groups",
           "select"]
