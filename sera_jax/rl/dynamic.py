"""DAPO dynamic sampling in the LM RL trainer: draw rounds until the batch holds B rows of
informative groups (`sera_jax.dynamic_sampling`), for methods with `dynamic_sampling`.

One step of such a method (`dapo`, `sera_dapo`; `Trainer.collect` dispatches here):

1. round i takes the next P prompt ids of the data stream (`next_prompt_ids`: the epoch
   order; a round that crosses an epoch end calls `history.start_epoch` first), looks up p̂,
   allocates B = P·N0 rollouts with the method's allocator (`objective.plan_rollouts`),
   samples, scores and computes the advantages and N0/N_q weights over its own groups
   (`Trainer.collect_round`, the path of every other method), then adds its outcomes to the
   history (pending until the next epoch start, as every step's outcomes are);
2. `dynamic_sampling.fill` stops after the round whose selection is full (fewer padding
   rows than the smallest group a round can produce: N0 for the uniform allocator,
   max(n_min, 2) otherwise) or after `config.max_rounds` rounds;
3. `dynamic_sampling.select` packs the informative groups (0 < K_q < N_q) first-fit, in draw
   order, into exactly B rows; each kept row keeps its round's advantage and weight, the
   rows left over are padding rows: weight 0, advantage 0, reward 0, zero length.

The choices mirror `sera_jax.integrations.tunix.SeraLearner` (`SeraOptions.max_rounds`,
refills = the next P prompts of the data, per-round history updates and epoch starts, the
same `min_group` and metrics), so the two engines run the same method.

Keys: round 0 samples with the step's sampling key, exactly as a step without dynamic
sampling does (so when round 0 fills the batch, the step is the uniform / SERA step);
round i >= 1 with `fold_in(fold_in(sample_key, ROUND_FOLD), i)`, away from the row keys
`fold_in(sample_key, r)` (r < B) and the null control's `SHUFFLE_FOLD`. With
`shuffle_rewards` (the null control) each round's rewards are permuted with its own key
before anything reads them: informativeness, advantages and history all see the shuffled
rewards, as they do without dynamic sampling.

The packed record (`DynamicRollouts`, what the train step and `return_rollouts` see): the
kept groups are segments 0..K-1 in draw order; prompt_ids / p_hat / counts /
prompt_weights are theirs (counts = the rollouts generated and trained for the group;
K may exceed P under an allocator, up to B / max(n_min, 2)); the padding rows repeat the
last kept row's prompt and belong to segment K-1, not counted in its N_q. With no
informative group at all (K = 0) the record lists the first generated group with count 0
and weight 0 (an inactive prompt, as SERA's are) and every row is padding: the update is
that of a zero gradient. `generated` is the record of every generated round concatenated
(segment ids offset by P per round); the step's metrics are computed on it
(`metrics`), so `reward_mean`, `mixed_fraction`, `active_prompts`, `rollouts_*`, `kappa_*`,
`generated_rollouts`, `generated_tokens`, `truncated_fraction` describe what was generated
(cost is matched on generated rollouts), while `live_row_fraction` and `train_width`
describe the packed batch; `dapo_rounds`, `dapo_kept_groups`, `dapo_padding_rows` are added.
The train step's history update is skipped (the rounds updated it); every generated group's
outcomes are in it, whether kept or not.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Protocol

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from sera_jax import dynamic_sampling as ds
from sera_jax import history as history_lib
from sera_jax import sharding as shd
from sera_jax.methods import Method
from sera_jax.rl.config import DEFAULT_MAX_ROUNDS
from sera_jax.rl.data import next_prompt_ids
from sera_jax.rl.state import Rollouts, TrainState
from sera_jax.tasks.base import RLTask

#: Round i >= 1 samples with `fold_in(fold_in(sample_key, ROUND_FOLD), i)`: distinct from
#: every row key `fold_in(sample_key, r)`, r < B < 2**31 - 2, and from `SHUFFLE_FOLD`.
ROUND_FOLD = 2**31 - 2


class RoundTrainer(Protocol):
    """What a dynamic-sampling step reads from its trainer (`rl.trainer.Trainer` is one):
    the run's config, task and method, the data and budget sizes, one round of steps 2-6
    (`collect_round`), the metrics of a record and the completion width the train step
    sees. This module depends on this interface only; the trainer imports this module."""

    config: ml_collections.ConfigDict
    task: RLTask
    method: Method
    num_prompts: int
    batch_prompts: int
    budget: int

    def collect_round(self, state: TrainState, history: history_lib.SuccessHistory,
                      ids: np.ndarray, epoch: int, cursor: int, sample_key: jax.Array
                      ) -> Rollouts: ...

    def rollout_metrics(self, r: Rollouts) -> dict[str, float | None]: ...

    def train_width(self, rollouts: Rollouts) -> int: ...


@dataclasses.dataclass
class DynamicRollouts(Rollouts):
    """The packed batch of a dynamic-sampling step (module docstring), with `generated`:
    every round's record concatenated, and `selection`: `dynamic_sampling.select`'s result
    (rows into `generated`, keep, group, counts)."""

    generated: Rollouts | None = None
    selection: ds.Selection | None = None


def round_key(sample_key: jax.Array, i: int) -> jax.Array:
    """The sampling key of round `i` (round 0: the step's own sampling key)."""
    return sample_key if i == 0 else jax.random.fold_in(
        jax.random.fold_in(sample_key, ROUND_FOLD), i)


def min_group(method: Method, n0: int, n_min: int) -> int:
    """The smallest group a round can produce: N0 for uniform counts, else max(n_min, 2)."""
    return n0 if method.allocator == "uniform" else max(int(n_min), ds.MIN_INFORMATIVE_GROUP)


def collect(trainer: RoundTrainer, state: TrainState
            ) -> tuple[DynamicRollouts, history_lib.SuccessHistory, Any]:
    """`Trainer.collect` of a dynamic-sampling method: rounds until the batch is full.

    Returns the packed record, the history after every round's epoch starts and outcomes,
    and the PRNG key to carry on (split once per step, as for every method)."""
    c = trainer.config
    pos = {"epoch": int(shd.to_host(state.epoch)), "cursor": int(shd.to_host(state.cursor)),
           "history": state.history}
    key = jax.random.wrap_key_data(jnp.asarray(shd.to_host(state.key)))
    key, sample_key = jax.random.split(key)
    rounds: list[Rollouts] = []

    def draw(i: int) -> ds.Round:
        ids, pos["epoch"], pos["cursor"], started = next_prompt_ids(
            c.seed, trainer.num_prompts, trainer.batch_prompts, pos["epoch"], pos["cursor"])
        history = pos["history"]
        for _ in range(started):
            history = history_lib.start_epoch(history)
        r = trainer.collect_round(state, history, ids, pos["epoch"], pos["cursor"],
                                  round_key(sample_key, i))
        pos["history"] = history_lib.update_from_rollouts(
            history, jnp.asarray(r.prompt_ids), jnp.asarray(r.segment_ids),
            jnp.asarray(r.rewards))
        rounds.append(r)
        return ds.Round(r.segment_ids, r.rewards, r.lengths, trainer.batch_prompts)

    _, chosen = ds.fill(draw, trainer.budget, int(c.get("max_rounds", DEFAULT_MAX_ROUNDS)),
                        min_group(trainer.method, int(c.rollouts_per_prompt),
                                  int(c.allocation.n_min)))
    return pack(rounds, chosen, trainer.batch_prompts, int(trainer.task.pad_id)), \
        pos["history"], key


def concatenate(rounds: list[Rollouts], num_prompts: int) -> Rollouts:
    """The rounds as one record: P-shaped arrays concatenated (R·P), rows too (R·B),
    segment ids of round i offset by i·P; data position of the last round; times summed."""
    cat = lambda field: np.concatenate([getattr(r, field) for r in rounds])  # noqa: E731
    last = rounds[-1]
    return Rollouts(
        prompt_ids=cat("prompt_ids"), p_hat=cat("p_hat"), counts=cat("counts"),
        prompt_weights=cat("prompt_weights"),
        segment_ids=np.concatenate([r.segment_ids + i * num_prompts
                                    for i, r in enumerate(rounds)]).astype(np.int32),
        prompt_tokens=cat("prompt_tokens"), prompt_mask=cat("prompt_mask"),
        completion_tokens=cat("completion_tokens"), lengths=cat("lengths"),
        truncated=cat("truncated"), rewards=cat("rewards"), advantages=cat("advantages"),
        weights=cat("weights"), epoch=last.epoch, cursor=last.cursor,
        sample_time=sum(r.sample_time for r in rounds),
        score_time=sum(r.score_time for r in rounds))


def pack(rounds: list[Rollouts], chosen: ds.Selection, num_prompts: int, pad_id: int
         ) -> DynamicRollouts:
    """The packed record of `chosen` (a `dynamic_sampling.select` of `rounds`)."""
    gen = concatenate(rounds, num_prompts)
    rows, keep = chosen.rows, chosen.keep
    groups = gen.segment_ids[rows]  # each packed row's group among all generated groups
    # Global group ids grow in draw order, and select numbers the kept groups in draw order.
    listed = np.unique(groups[keep]) if chosen.num_kept else groups[:1]
    kept = np.full(len(listed), chosen.num_kept > 0)
    pick = lambda x: np.where(keep.reshape(-1, *[1] * (x.ndim - 1)), x[rows], 0  # noqa: E731
                              ).astype(x.dtype)
    tokens = gen.completion_tokens[rows]
    tokens[~keep] = pad_id
    return DynamicRollouts(
        prompt_ids=gen.prompt_ids[listed], p_hat=gen.p_hat[listed],
        counts=np.where(kept, gen.counts[listed], 0).astype(gen.counts.dtype),
        prompt_weights=np.where(kept, gen.prompt_weights[listed], 0).astype(
            gen.prompt_weights.dtype),
        segment_ids=chosen.group.astype(np.int32), prompt_tokens=gen.prompt_tokens[rows],
        prompt_mask=gen.prompt_mask[rows], completion_tokens=tokens, lengths=pick(gen.lengths),
        truncated=pick(gen.truncated), rewards=pick(gen.rewards),
        advantages=pick(gen.advantages), weights=pick(gen.weights), epoch=gen.epoch,
        cursor=gen.cursor, sample_time=gen.sample_time, score_time=gen.score_time,
        generated=gen, selection=chosen)


def metrics(trainer: RoundTrainer, r: DynamicRollouts) -> dict[str, float | None]:
    """The step's metrics (module docstring): `rollout_metrics` of everything generated,
    the packed batch's `live_row_fraction` and `train_width`, and the `dapo_*` counts."""
    out = trainer.rollout_metrics(r.generated)
    s = r.selection
    out.update(live_row_fraction=float(np.mean(r.live)),
               train_width=float(trainer.train_width(r)), dapo_rounds=float(s.rounds),
               dapo_kept_groups=float(s.num_kept), dapo_padding_rows=float(s.padding_rows))
    return out


__all__ = ["ROUND_FOLD", "DynamicRollouts", "RoundTrainer", "collect", "concatenate",
           "metrics", "min_group", "pack", "round_key"]
