"""The RL trainer's pytrees: the checkpointed `TrainState`, the device `RolloutBatch` (or
`PrefixBatch`) and the host `Rollouts` record of one step."""

from __future__ import annotations

import dataclasses
from typing import Any

import flax.struct
import jax
import numpy as np

from sera_jax import history as history_lib


@dataclasses.dataclass(frozen=True)
class TrainState:
    """Everything a resumed run needs (a pytree of arrays; checkpointed as a whole).

    params: the policy's `nnx.State` (merge with `Trainer.graphdef`).
    opt_state: optax AdamW (+ clip) state.
    history: `SuccessHistory` over the split's prompt ids.
    key: uint32[2] raw PRNG key data (`jax.random.key_data`), split once per step.
    step: int32[], optimiser updates done.
    epoch, cursor: int32[], data position: the next prompt is
      `epoch_permutation(seed, epoch, M)[cursor]`.
    alloc_state: a stateful method's allocator state (`Method.stateful`, e.g. gdro's
      `GdroState`; replicated like `history`), None for every other method. A pytree child
      only when set: the state of a stateless method has exactly the leaves (paths, shapes,
      checkpoint layout) it had before this field existed, so its old checkpoints restore.
    """

    params: Any
    opt_state: Any
    history: history_lib.SuccessHistory
    key: jax.Array
    step: jax.Array
    epoch: jax.Array
    cursor: jax.Array
    alloc_state: Any = None

    def replace(self, **changes: Any) -> TrainState:
        """A copy with `changes` (as `flax.struct` dataclasses do)."""
        return dataclasses.replace(self, **changes)


_STATE_FIELDS = ("params", "opt_state", "history", "key", "step", "epoch", "cursor")


def _state_children(s: TrainState) -> tuple[str, ...]:
    return _STATE_FIELDS + (("alloc_state",) if s.alloc_state is not None else ())


jax.tree_util.register_pytree_with_keys(
    TrainState,
    lambda s: ([(jax.tree_util.GetAttrKey(n), getattr(s, n)) for n in _state_children(s)],
               s.alloc_state is not None),
    lambda _, children: TrainState(*children),
    flatten_func=lambda s: ([getattr(s, n) for n in _state_children(s)],
                            s.alloc_state is not None))


@flax.struct.dataclass
class RolloutBatch:
    """The flat rollout batch of one step, all `[B, ...]` (rows sharded over the batch axes)."""

    prompt_tokens: jax.Array  # int32 [B, W], left-padded
    prompt_mask: jax.Array  # bool [B, W]
    completion_tokens: jax.Array  # int32 [B, T]
    completion_mask: jax.Array  # bool [B, T], True on generated tokens (stop included)
    advantages: jax.Array  # float32 [B]
    weights: jax.Array  # float32 [B], multiplicity weight of the row's prompt


@flax.struct.dataclass
class PrefixBatch:
    """The rollout batch of one step for `rl.share_prompt_prefix`, already split into M
    contiguous micro-batches of R rows: micro-batch m's rows continue its S prompt slots.

    Prompt slots are replicated; row arrays are split over the batch axes along R.
    """

    prompt_tokens: jax.Array  # int32 [M, S, W], left-padded (unused slots repeat one)
    prompt_mask: jax.Array  # bool [M, S, W]
    row_prompt: jax.Array  # int32 [M, R]: the slot (of its micro-batch) a row continues
    completion_tokens: jax.Array  # int32 [M, R, T]
    completion_mask: jax.Array  # bool [M, R, T]
    advantages: jax.Array  # float32 [M, R]
    weights: jax.Array  # float32 [M, R]


@dataclasses.dataclass
class Rollouts:
    """Host (NumPy) record of one step's rollouts; rows are grouped by prompt.

    P-shaped: prompt_ids (dataset ids), p_hat (NaN = unseen), counts N_q, prompt_weights
    (w_q used by the loss). B-shaped: segment_ids, prompt_tokens/prompt_mask [B, W],
    completion_tokens [B, T], lengths, truncated, rewards, advantages, weights. A two-stage
    method's `pilot_successes` (int32 [P], K¹ of its pilot: rollouts 0..m−1 of each prompt,
    the first m rows of its group) and a stateful method's `alloc_state` (the allocator's
    next state, host arrays) are None for the other methods.
    """

    prompt_ids: np.ndarray
    p_hat: np.ndarray
    counts: np.ndarray
    prompt_weights: np.ndarray
    segment_ids: np.ndarray
    prompt_tokens: np.ndarray
    prompt_mask: np.ndarray
    completion_tokens: np.ndarray
    lengths: np.ndarray
    truncated: np.ndarray
    rewards: np.ndarray
    advantages: np.ndarray
    weights: np.ndarray
    epoch: int
    cursor: int
    sample_time: float
    #: Seconds of `task.score` (host verifier) for the step's completions.
    score_time: float = 0.0
    pilot_successes: np.ndarray | None = None
    alloc_state: Any = None

    @property
    def live(self) -> np.ndarray:
        """bool [B]: rows whose loss coefficient w_r A_r is non-zero (the rest add 0)."""
        return self.advantages * self.weights != 0

    @property
    def completion_mask(self) -> np.ndarray:
        """bool [B, T]: generated tokens (stop token included)."""
        return np.arange(self.completion_tokens.shape[1])[None, :] < self.lengths[:, None]
