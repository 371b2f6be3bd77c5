"""The one path from success estimates to the SERA/MaxRL surrogate loss, shared by the RL
trainer, the allocation lab and the alignment study:

    allocate -> counts N_q, prompt weights w_q -> segment ids, ranks     (`plan_rollouts`)
    (the caller samples row r = rollout `ranks[r]` of prompt `segment_ids[r]`, scores it)
    rewards -> advantages A_r, rollout weights w_r = w_{q(r)}           (`rollout_coefficients`)
    log-probs -> −(1/(P·N0)) Σ_r w_r A_r ℓ_r (the chosen aggregation)    (`surrogate_loss`)

Pure functions on flat arrays with static shapes (P prompts, B = P·N0 rows however the
counts move): jit- and vmap-able (the lab traces them inside a vmap over seeds), and
callable eagerly on host values (the trainer allocates on the host before any jit).
`method` is a `sera_jax.methods.Method` (a static, hashable value).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from sera_jax import estimators


class RolloutPlan(NamedTuple):
    """One step's rollouts before sampling: P prompts, B rows."""

    counts: jax.Array  # int32 [P], N_q, summing to B
    prompt_weights: jax.Array  # float32 [P], w_q (N0/N_q, or 1{N_q > 0}); 0 inactive
    segment_ids: jax.Array  # int32 [B], prompt of row r (rows of a prompt contiguous)
    ranks: jax.Array  # int32 [B], r's index within its prompt's rows (0..N_q − 1)
    # A stateful allocator's next state (`Allocation.state`, `Method.stateful`); else None.
    state: Any = None


def plan_from_counts(counts: Any, prompt_weights: Any, budget: int) -> RolloutPlan:
    """The plan of given counts N_q [P] (summing to `budget`) and prompt weights w_q [P]:
    segment_ids = repeat(arange(P), N), ranks[r] = r − Σ_{q < seg[r]} N_q."""
    segment_ids = estimators.segment_ids_from_counts(counts, budget)
    ranks = estimators.ranks_in_segments(counts, segment_ids)
    return RolloutPlan(jnp.asarray(counts), jnp.asarray(prompt_weights, jnp.float32),
                       segment_ids, ranks)


def plan_rollouts(method: Any, p_hat: Any, budget: int, *, n_min: int, n_max: int,
                  unseen: str = "fill", shift: int | None = None, pilot_successes: Any = None,
                  alpha: Any = None, beta: Any = None, state: Any = None) -> RolloutPlan:
    """`method`'s allocation of `budget` rollouts over the P prompts of `p_hat` (NaN = unseen)
    as a plan: `Method.allocate` (extra inputs passed through; `state`: a stateful
    allocator's, whose next state is the plan's `state`), then w_q = `Method.prompt_weights`
    (N0/N_q, or 1{N_q > 0} without the multiplicity correction), then `plan_from_counts`."""
    alloc = method.allocate(p_hat, budget, n_min=n_min, n_max=n_max, unseen=unseen, shift=shift,
                            pilot_successes=pilot_successes, alpha=alpha, beta=beta,
                            state=state)
    plan = plan_from_counts(alloc.counts, method.prompt_weights(alloc.counts, alloc.weights),
                            budget)
    return plan if alloc.state is None else plan._replace(state=alloc.state)


def rollout_coefficients(rewards: Any, plan: RolloutPlan, estimator: str
                         ) -> tuple[jax.Array, jax.Array]:
    """(advantages A [B], rollout weights w [B]): A = `ADVANTAGE_ESTIMATORS[estimator]` on
    the rewards grouped by `plan.segment_ids`, w_r = w_{q(r)} (`estimators.rollout_weights`)."""
    num_prompts = plan.prompt_weights.shape[0]
    advantages = estimators.get_advantage_estimator(estimator)(rewards, plan.segment_ids,
                                                                num_prompts)
    return advantages, estimators.rollout_weights(plan.prompt_weights, plan.segment_ids)


def surrogate_loss(logprobs: Any, rewards: Any, plan: RolloutPlan, *, estimator: str,
                   aggregation: str, n0: int, mask: Any = None, max_len: int | None = None,
                   num_tokens: Any = None) -> jax.Array:
    """`estimators.policy_gradient_loss` of the plan's rows with `rollout_coefficients`:
    logprobs [B, T] with `mask` [B, T], or [B] (one token per rollout: mask all True,
    max_len 1). P = len(plan.counts); a scalar whose gradient is minus the weighted policy
    gradient (advantages and weights are constants)."""
    advantages, weights = rollout_coefficients(rewards, plan, estimator)
    logprobs = jnp.asarray(logprobs)
    if logprobs.ndim == 1:
        logprobs, mask, max_len = logprobs[:, None], jnp.ones((logprobs.shape[0], 1), bool), 1
    return estimators.policy_gradient_loss(
        logprobs, mask, advantages, weights, aggregation=aggregation,
        num_prompts=plan.counts.shape[0], n0=n0, max_len=max_len, num_tokens=num_tokens)


__all__ = ["RolloutPlan", "plan_from_counts", "plan_rollouts", "rollout_coefficients",
           "surrogate_loss"]
