"""Steps 2-6 of one round of the LM RL trainer (`Trainer.collect_round`): p̂ -> allocation ->
sample -> score -> advantages, for the three kinds of allocator:

- *one-shot* (most methods): the plan of p̂ (`objective.plan_rollouts`), then the B rows
  sampled at once, row r with key `fold_in(sample_key, r)`;
- *stateful* (`Method.stateful`: `gdro`'s shadow-price controller): the allocator also gets
  `TrainState.alloc_state` (a fresh `Method.init_state()` at step 0, `Trainer.init_state`)
  and its next state (`RolloutPlan.state`) comes back in `Rollouts.alloc_state`; the step
  puts it in the new `TrainState`, replicated like the history and checkpointed with the
  rest, so a resumed run continues the controller exactly;
- *two-stage* (`Method.two_stage`: `sera_sequential`, `pilot_commit`): the in-step pilot of
  the allocation lab (`sera_jax.studies.lab.train`). The pilot is rollouts 0..m−1 of every
  prompt (m = `Method.pilot_size(n_min)`), sampled and scored first; their successes K¹
  go to the allocator (`pilot_successes`), whose counts N_q >= m include them; then the
  rest, rollouts m..N_q−1 of each prompt (B − P·m in all), is sampled and scored. The batch
  trained is each prompt's pilot and commit rollouts pooled, one group of N_q rows per
  prompt (advantages and the N0/N_q weights over all N_q), as in the lab: B rollouts
  generated and trained, exactly. Rollout j of prompt q samples with key
  `fold_in(sample_key, q·n_max + j)`, a function of (q, j) only, so the pilot rows are the
  first m rows of each group whatever the counts. The pilot's successes are counted from the
  task's rewards before `shuffle_rewards` (the null control permutes the B rows afterwards,
  as the lab does); a task must score binary rewards (`RLTask.score`).

Allocators that take a Beta posterior (`alpha`, `beta`: `sera_sequential`, `hit_utility`,
`sera_posterior`) get it from p̂ and their `pseudo_count` here, the lab's
`posterior_from_history=False`. Nothing here imports `rl.trainer` (it imports this module);
the trainer is read through `SampleTrainer`.
"""

from __future__ import annotations

import time
from typing import Any, Protocol

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from sera_jax import history as history_lib
from sera_jax import objective
from sera_jax import sharding as shd
from sera_jax.methods import Method
from sera_jax.rl.state import Rollouts, TrainState
from sera_jax.sampling import SampleOutput, left_pad
from sera_jax.tasks.base import RLTask

#: `fold_in(sample_key, SHUFFLE_FOLD)` keys the null control's reward permutation: distinct
#: from every sampling row key `fold_in(sample_key, r)` (r < B, or r < P·n_max two-stage).
SHUFFLE_FOLD = 2**31 - 1


class SampleTrainer(Protocol):
    """What a round reads from its trainer (`rl.trainer.Trainer` is one)."""

    config: ml_collections.ConfigDict
    task: RLTask
    method: Method
    budget: int

    def sample(self, state: TrainState, prompts: np.ndarray, prompt_mask: np.ndarray,
               segment_ids: np.ndarray, key: jax.Array, row_keys: jax.Array | None = None
               ) -> SampleOutput: ...


def shuffle_rewards(rewards: np.ndarray, sample_key: jax.Array) -> np.ndarray:
    """The null control's rewards: `rewards[π]` for the permutation π of the step's B rows
    drawn from `fold_in(sample_key, SHUFFLE_FOLD)` (a pure function of the step key).

    Only positions within the batch move: the multiset of rewards (so the batch reward mean)
    is unchanged, the link between a rollout and its reward is destroyed.
    """
    perm = np.asarray(jax.random.permutation(jax.random.fold_in(sample_key, SHUFFLE_FOLD),
                                             rewards.shape[0]))
    return np.asarray(rewards)[perm]


def rank_keys(sample_key: jax.Array, segment_ids: np.ndarray, ranks: np.ndarray,
              n_max: int) -> jax.Array:
    """A two-stage step's row keys: rollout `ranks[r]` of prompt `segment_ids[r]` samples
    with `fold_in(sample_key, segment_ids[r]·n_max + ranks[r])`."""
    index = jnp.asarray(np.asarray(segment_ids, np.int64) * n_max + ranks, jnp.uint32)
    return jax.vmap(lambda i: jax.random.fold_in(sample_key, i))(index)


def host_state(alloc_state: Any) -> Any:
    """The allocator state of a `TrainState` (replicated arrays) as host NumPy (None: None)."""
    return jax.tree.map(shd.to_host, alloc_state)


def _score(task: RLTask, split: str, row_ids: np.ndarray, out: SampleOutput
           ) -> tuple[np.ndarray, float]:
    t = time.perf_counter()
    rows = len(row_ids)
    completions = [out.tokens[r, : out.lengths[r]] for r in range(rows)]
    rewards = np.asarray(task.score(split, row_ids.tolist(), completions, out.truncated),
                         np.float32)
    if rewards.shape != (rows,):
        raise ValueError(f"task.score returned shape {rewards.shape}; expected ({rows},), "
                         "one reward per completion")
    return rewards, time.perf_counter() - t


def _pilot_successes(rewards: np.ndarray, num_prompts: int, m: int) -> np.ndarray:
    """K¹ [P] of the pilot's rewards (prompt-major, m each): integers, or a clear error."""
    k1 = rewards.reshape(num_prompts, m).sum(axis=1)
    if not np.all((rewards == 0) | (rewards == 1)):
        raise ValueError("a two-stage method counts its pilot's successes: task.score must "
                         f"return binary rewards (0 or 1), got {np.unique(rewards)[:8]}")
    return k1.astype(np.int32)


def collect_round(trainer: SampleTrainer, state: TrainState,
                  history: history_lib.SuccessHistory, ids: np.ndarray, epoch: int,
                  cursor: int, sample_key: jax.Array) -> Rollouts:
    """Steps 2-6 for the P prompts `ids` (data position after them: epoch, cursor): the
    module docstring, per kind of allocator."""
    c, task, method, budget = trainer.config, trainer.task, trainer.method, trainer.budget
    a = c.allocation
    # Allocate on host values: identical on every process, validated before any jit.
    p_hat = shd.to_host(history_lib.lookup(history, jnp.asarray(ids)))
    prompts, pmask = left_pad(task.prompt_tokens(c.split, ids.tolist()),
                              int(task.max_prompt_len), int(task.pad_id))
    m = method.pilot_size(a.n_min)
    k1, t_sample, t_score = None, 0.0, 0.0
    if m:  # the pilot: rollouts 0..m-1 of every prompt
        pilot_seg = np.repeat(np.arange(len(ids)), m)
        pilot_rank = np.tile(np.arange(m), len(ids))
        t = time.perf_counter()
        pilot = trainer.sample(state, prompts, pmask, pilot_seg, sample_key,
                               row_keys=rank_keys(sample_key, pilot_seg, pilot_rank, a.n_max))
        t_sample += time.perf_counter() - t
        pilot_rewards, dt = _score(task, c.split, ids[pilot_seg], pilot)
        t_score += dt
        k1 = _pilot_successes(pilot_rewards, len(ids), m)
    plan = jax.tree.map(shd.to_host, objective.plan_rollouts(
        method, jnp.asarray(p_hat), budget, n_min=a.n_min, n_max=a.n_max, unseen=a.unseen,
        pilot_successes=k1,
        state=host_state(state.alloc_state) if method.stateful else None))
    counts, segment_ids = plan.counts.astype(np.int32), plan.segment_ids
    if not m:
        t = time.perf_counter()
        out = trainer.sample(state, prompts, pmask, segment_ids, sample_key)
        t_sample += time.perf_counter() - t
        rewards, dt = _score(task, c.split, ids[segment_ids], out)
        t_score += dt
    else:  # pool each prompt's pilot rows (ranks < m) with its commit rows (the rest)
        ranks = np.asarray(plan.ranks)
        from_pilot, commit = ranks < m, ranks >= m
        more, more_rewards = None, None
        if commit.any():
            t = time.perf_counter()
            more = trainer.sample(state, prompts, pmask, segment_ids[commit], sample_key,
                                  row_keys=rank_keys(sample_key, segment_ids[commit],
                                                     ranks[commit], a.n_max))
            t_sample += time.perf_counter() - t
            more_rewards, dt = _score(task, c.split, ids[segment_ids[commit]], more)
            t_score += dt

        def pooled(x_pilot: np.ndarray, x_commit: np.ndarray | None = None) -> np.ndarray:
            x = np.zeros((budget, *x_pilot.shape[1:]), x_pilot.dtype)
            x[from_pilot] = x_pilot[segment_ids[from_pilot] * m + ranks[from_pilot]]
            if x_commit is not None:
                x[commit] = x_commit
            return x

        out = jax.tree.map(pooled, *((pilot,) if more is None else (pilot, more)))
        rewards = pooled(pilot_rewards, more_rewards)
    if c.get("shuffle_rewards", False):
        rewards = shuffle_rewards(rewards, sample_key)
    advantages, weights = (shd.to_host(x) for x in objective.rollout_coefficients(
        rewards, plan, method.estimator))
    return Rollouts(
        prompt_ids=ids, p_hat=p_hat, counts=counts, prompt_weights=plan.prompt_weights,
        segment_ids=segment_ids.astype(np.int32), prompt_tokens=prompts[segment_ids],
        prompt_mask=pmask[segment_ids], completion_tokens=out.tokens, lengths=out.lengths,
        truncated=out.truncated, rewards=rewards, advantages=advantages.astype(np.float32),
        weights=weights.astype(np.float32), epoch=epoch, cursor=cursor,
        sample_time=t_sample, score_time=t_score, pilot_successes=k1, alloc_state=plan.state)


__all__ = ["SHUFFLE_FOLD", "SampleTrainer", "collect_round", "host_state", "rank_keys",
           "shuffle_rewards"]
