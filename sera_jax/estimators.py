"""Per-rollout advantages for ragged rollout groups, multiplicity weights and the PG loss.

A batch holds P prompts; prompt q has N_q rollouts (N_q may differ, and may be 0 for a prompt
SERA left inactive). Rollouts are a flat array of R rows plus `segment_ids[r]` = the prompt
index of row r in [0, P) and a static `num_segments` = P (SERA_SPEC §2, DEVELOPING.md).
Group statistics are `jax.ops.segment_sum`s, so no Python loop over prompts, and shapes stay
static however the counts move.

Every estimator is written once, as an elementwise function of the reward and its group's
statistics (count N, mean r̄, centred sum of squares). Two reductions feed it: segment sums
over the flat batch (`maxrl(...)`, ...) and masked row sums over a padded `[P, n_max]` batch
(`padded_advantages`, a `jax.vmap` of a per-group function). The two agree by construction of
the formulas and by test.

For one prompt with N rollouts, K = Σ r_i successes, scores S_i = ∇log π(z_i|x), the
gradient estimate is g = (1/N) Σ_i A_i S_i. With the multiplicity correction (SERA_SPEC §3),
the batch gradient is (1/(P·N0)) Σ_r w_r A_r S_r with w_q = N0/N_q: each prompt contributes
its within-group mean / P (see `policy_gradient_loss`).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

#: ε of the centred MaxRL advantage (r_i − r̄)/(r̄ + ε) [paper].
MAXRL_EPS = 1e-6
#: ε added to the group std of GRPO (as in verl).
GRPO_EPS = 1e-6

AGGREGATIONS = ("token_mean", "sequence_mean", "seq_mean_token_sum_norm")


# ----------------------------------------------------------------------------- validation


def _is_concrete(*xs: Any) -> bool:
    """True when no argument is a tracer (values can be inspected on the host)."""
    return not any(isinstance(x, jax.core.Tracer) for x in xs)


def _check_static_int(name: str, value: Any, minimum: int) -> int:
    if isinstance(value, jax.core.Tracer):
        raise ValueError(f"{name} must be a static Python int (mark it static under jit)")
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < minimum:
        raise ValueError(f"{name}={value!r} is invalid; expected an integer >= {minimum}")
    return int(value)


def _as_float(x: Any) -> jax.Array:
    x = jnp.asarray(x)
    return x if jnp.issubdtype(x.dtype, jnp.floating) else x.astype(jnp.float32)


def _check_rewards(rewards: jax.Array, requires_binary: bool) -> None:
    if not _is_concrete(rewards):
        return
    host = np.asarray(rewards)
    if not np.all(np.isfinite(host)):
        raise ValueError("rewards contain NaN or inf; every reward must be finite")
    if requires_binary and not np.all((host == 0) | (host == 1)):
        bad = host[(host != 0) & (host != 1)][0]
        raise ValueError(
            f"rewards must be binary (0 or 1) for this estimator; got {bad!r}. "
            "Use 'grpo', 'rloo' or 'reinforce' for non-binary rewards."
        )


def _check_segment_ids(segment_ids: jax.Array, num_rows: int, num_segments: int) -> None:
    if segment_ids.shape != (num_rows,):
        raise ValueError(
            f"segment_ids has shape {segment_ids.shape}; expected ({num_rows},), one per rollout"
        )
    if not jnp.issubdtype(segment_ids.dtype, jnp.integer):
        raise ValueError(f"segment_ids must be integers; got dtype {segment_ids.dtype}")
    if _is_concrete(segment_ids) and num_rows:
        host = np.asarray(segment_ids)
        lo, hi = int(host.min()), int(host.max())
        if lo < 0 or hi >= num_segments:
            bad = lo if lo < 0 else hi
            raise ValueError(
                f"segment_ids contains {bad}; allowed range is [0, num_segments={num_segments})"
            )


def _check_2d_with_mask(name: str, x: jax.Array, mask_name: str, mask: jax.Array,
                        dims: str) -> None:
    if x.ndim != 2:
        raise ValueError(f"{name} must be 2-D {dims}; got shape {x.shape}")
    if mask.shape != x.shape or mask.dtype != jnp.bool_:
        raise ValueError(
            f"{mask_name} must be bool with the shape of {name} {x.shape}; "
            f"got {mask.dtype}{list(mask.shape)}"
        )


# ----------------------------------------------------------------------------- segment ids


def ranks_in_segments(counts: jax.Array, segment_ids: jax.Array) -> jax.Array:
    """Index of each rollout within its prompt's group: rank[r] = r − Σ_{q < seg[r]} N_q
    (int32 [B]), for the contiguous layout of `segment_ids_from_counts`."""
    counts = jnp.asarray(counts)
    start = jnp.cumsum(counts) - counts
    return (jnp.arange(segment_ids.shape[0]) - start[segment_ids]).astype(jnp.int32)


def segment_ids_from_counts(counts: jax.Array, total: int) -> jax.Array:
    """Prompt index of each rollout: `repeat(arange(P), counts)`, static length `total`.

    Rows of one prompt are contiguous; `total` (the budget B) is static, so the shape does
    not change when the counts do. Raises ValueError when concrete counts are negative or do
    not sum to `total` (jnp.repeat would silently pad or truncate).
    """
    total = _check_static_int("total", total, 0)
    counts = jnp.asarray(counts)
    if counts.ndim != 1:
        raise ValueError(f"counts must be 1-D [P]; got shape {counts.shape}")
    if not jnp.issubdtype(counts.dtype, jnp.integer):
        raise ValueError(f"counts must be integers; got dtype {counts.dtype}")
    if _is_concrete(counts):
        host = np.asarray(counts)
        if host.size and host.min() < 0:
            raise ValueError(f"counts must be >= 0; got {int(host.min())}")
        if int(host.sum()) != total:
            raise ValueError(f"counts sum to {int(host.sum())}; they must sum to total={total}")
    return jnp.repeat(
        jnp.arange(counts.shape[0], dtype=jnp.int32), counts, total_repeat_length=total
    )


def rollout_weights(prompt_weights: jax.Array, segment_ids: jax.Array) -> jax.Array:
    """Per-rollout multiplicity weight w_r = prompt_weights[segment_ids[r]].

    `prompt_weights` is `Allocation.weights` (w_q = N0/N_q, 0 for inactive prompts) for the
    multiplicity correction, or `jnp.ones(P)` for the ablation without it.
    """
    prompt_weights = _as_float(prompt_weights)
    segment_ids = jnp.asarray(segment_ids)
    if prompt_weights.ndim != 1:
        raise ValueError(f"prompt_weights must be 1-D [P]; got shape {prompt_weights.shape}")
    if segment_ids.ndim != 1:
        raise ValueError(f"segment_ids must be 1-D [R]; got shape {segment_ids.shape}")
    _check_segment_ids(segment_ids, segment_ids.shape[0], prompt_weights.shape[0])
    return prompt_weights[segment_ids]


# ----------------------------------------------------------------------------- estimators


class GroupStats(NamedTuple):
    """Statistics of each rollout's group, broadcast to the rollout (all shaped like rewards)."""

    count: jax.Array  # N_q
    mean: jax.Array  # r̄_q = K_q / N_q
    m2: jax.Array  # Σ_{i in q} (r_i − r̄_q)²
    batch_mean: jax.Array  # scalar: mean reward over every rollout of the batch


def _maxrl(r: jax.Array, s: GroupStats, *, eps: float = MAXRL_EPS) -> jax.Array:
    # All-zero group: r̄ = 0 and every r_i − r̄ = 0, so A = 0 exactly (no 0/0).
    return (r - s.mean) / (s.mean + eps)


def _maxrl_conditional(r: jax.Array, s: GroupStats) -> jax.Array:
    positive = s.mean > 0
    return jnp.where(positive, r / jnp.where(positive, s.mean, 1.0), 0.0)


def _grpo(r: jax.Array, s: GroupStats, *, eps: float = GRPO_EPS, ddof: int = 1) -> jax.Array:
    std = jnp.sqrt(s.m2 / jnp.maximum(s.count - ddof, 1.0))
    return (r - s.mean) / (std + eps)


def _rloo(r: jax.Array, s: GroupStats) -> jax.Array:
    # r_i − mean of the other N−1 rewards = N/(N−1)·(r_i − r̄); undefined (0) for N = 1.
    return jnp.where(s.count > 1, (r - s.mean) * s.count / jnp.maximum(s.count - 1, 1.0), 0.0)


def _reinforce(r: jax.Array, s: GroupStats, *, baseline: str = "none") -> jax.Array:
    if baseline == "none":
        return r
    if baseline == "batch_mean":
        return r - s.batch_mean
    raise ValueError(f"baseline={baseline!r} is invalid; expected 'none' or 'batch_mean'")


@functools.partial(jax.jit, static_argnames=("group_fn", "num_segments", "kwargs"))
def _segment_apply(
    group_fn: Callable[..., jax.Array],
    rewards: jax.Array,
    segment_ids: jax.Array,
    num_segments: int,
    kwargs: tuple[tuple[str, Any], ...],
) -> jax.Array:
    count = jax.ops.segment_sum(jnp.ones_like(rewards), segment_ids, num_segments)
    total = jax.ops.segment_sum(rewards, segment_ids, num_segments)
    mean = (total / jnp.maximum(count, 1.0))[segment_ids]
    # Two-pass variance: no cancellation for rewards far from 0.
    m2 = jax.ops.segment_sum((rewards - mean) ** 2, segment_ids, num_segments)[segment_ids]
    batch_mean = jnp.sum(rewards) / max(rewards.shape[0], 1)
    stats = GroupStats(count[segment_ids], mean, m2, batch_mean)
    return group_fn(rewards, stats, **dict(kwargs)).astype(rewards.dtype)


def _group_advantages(
    group_fn: Callable[..., jax.Array],
    rewards: jax.Array,
    mask: jax.Array,
    batch_mean: jax.Array,
    kwargs: tuple[tuple[str, Any], ...],
) -> jax.Array:
    """Advantages of one padded group: rewards [n_max], mask [n_max] (True = real rollout)."""
    m = mask.astype(rewards.dtype)
    count = jnp.sum(m)
    mean = jnp.sum(rewards * m) / jnp.maximum(count, 1.0)
    m2 = jnp.sum(m * (rewards - mean) ** 2)
    ones = jnp.ones_like(rewards)
    stats = GroupStats(count * ones, mean * ones, m2 * ones, batch_mean)
    return jnp.where(mask, group_fn(rewards, stats, **dict(kwargs)), 0.0)


@functools.partial(jax.jit, static_argnames=("group_fn", "kwargs"))
def _padded_apply(
    group_fn: Callable[..., jax.Array],
    rewards: jax.Array,
    mask: jax.Array,
    kwargs: tuple[tuple[str, Any], ...],
) -> jax.Array:
    m = mask.astype(rewards.dtype)
    batch_mean = jnp.sum(rewards * m) / jnp.maximum(jnp.sum(m), 1.0)
    per_group = functools.partial(_group_advantages, group_fn, kwargs=kwargs)
    out = jax.vmap(per_group, in_axes=(0, 0, None))(rewards, mask, batch_mean)
    return out.astype(rewards.dtype)


@dataclasses.dataclass(frozen=True)
class AdvantageEstimator:
    """A registered estimator: call it on a flat batch, or `.padded(...)` on a padded one.

    `kappa_shift` is the shift s of its finite-rollout scale factor κ(p, N) = 1 − (1−p)^(N−s)
    (SERA_SPEC §2) for the MaxRL estimators, and None where SERA's equalisation does not apply.
    """

    name: str
    group_fn: Callable[..., jax.Array]
    requires_binary: bool
    kappa_shift: int | None
    doc: str

    def __call__(
        self, rewards: jax.Array, segment_ids: jax.Array, num_segments: int, **kwargs: Any
    ) -> jax.Array:
        """Advantages [R] of a flat batch: rewards [R], segment_ids [R] in [0, num_segments)."""
        num_segments = _check_static_int("num_segments", num_segments, 1)
        rewards = _as_float(rewards)
        if rewards.ndim != 1:
            raise ValueError(f"rewards must be 1-D [R]; got shape {rewards.shape}")
        segment_ids = jnp.asarray(segment_ids)
        _check_segment_ids(segment_ids, rewards.shape[0], num_segments)
        _check_rewards(rewards, self.requires_binary)
        return _segment_apply(
            self.group_fn, rewards, segment_ids, num_segments, tuple(sorted(kwargs.items()))
        )

    def padded(self, rewards: jax.Array, mask: jax.Array, **kwargs: Any) -> jax.Array:
        """Advantages [P, n_max] of a padded batch (0 where `mask` is False)."""
        return padded_advantages(self, rewards, mask, **kwargs)


def padded_advantages(
    estimator: str | AdvantageEstimator, rewards: jax.Array, mask: jax.Array, **kwargs: Any
) -> jax.Array:
    """Advantages for a padded batch: rewards [P, n_max], mask [P, n_max] (True = rollout).

    A `jax.vmap` over prompts of the per-group formula; equal to the flat version on the
    rows where `mask` is True, 0 elsewhere. Padded rewards are ignored (may be anything
    finite).
    """
    est = estimator if isinstance(estimator, AdvantageEstimator) else get_advantage_estimator(
        estimator
    )
    rewards = _as_float(rewards)
    mask = jnp.asarray(mask)
    _check_2d_with_mask("rewards", rewards, "mask", mask, "[P, n_max]")
    if _is_concrete(rewards, mask):
        _check_rewards(np.asarray(rewards)[np.asarray(mask)], est.requires_binary)
    return _padded_apply(est.group_fn, rewards, mask, tuple(sorted(kwargs.items())))


def maxrl(
    rewards: jax.Array, segment_ids: jax.Array, num_segments: int, *, eps: float = MAXRL_EPS
) -> jax.Array:
    """Centred MaxRL advantage A_i = (r_i − r̄_q)/(r̄_q + ε) (0 for an all-zero group).

    E[(1/N)Σ A_i S_i] = (1 − (1−p)^(N−1)) ∇log p (ignoring ε): shift s = 1. Binary rewards.
    """
    return ADVANTAGE_ESTIMATORS["maxrl"](rewards, segment_ids, num_segments, eps=eps)


def maxrl_conditional(
    rewards: jax.Array, segment_ids: jax.Array, num_segments: int
) -> jax.Array:
    """Conditional MaxRL advantage A_i = N_q r_i / K_q (= r_i / r̄_q), 0 when K_q = 0.

    Then (1/N)Σ A_i S_i = (1/K)Σ r_i S_i, the mean score of the successes, with
    E = (1 − (1−p)^N) ∇log p: shift s = 0. Binary rewards.
    """
    return ADVANTAGE_ESTIMATORS["maxrl_conditional"](rewards, segment_ids, num_segments)


def grpo(
    rewards: jax.Array,
    segment_ids: jax.Array,
    num_segments: int,
    *,
    eps: float = GRPO_EPS,
    ddof: int = 1,
) -> jax.Array:
    """GRPO advantage A_i = (r_i − r̄_q)/(std_q + ε).

    std_q uses `ddof` (default 1: the unbiased std of torch.std, as verl and TRL); a group
    of one rollout gets A = 0.
    """
    return ADVANTAGE_ESTIMATORS["grpo"](rewards, segment_ids, num_segments, eps=eps, ddof=ddof)


def rloo(rewards: jax.Array, segment_ids: jax.Array, num_segments: int) -> jax.Array:
    """RLOO advantage A_i = r_i − mean_{j≠i} r_j = N/(N−1)·(r_i − r̄_q); 0 when N_q = 1."""
    return ADVANTAGE_ESTIMATORS["rloo"](rewards, segment_ids, num_segments)


def reinforce(
    rewards: jax.Array, segment_ids: jax.Array, num_segments: int, *, baseline: str = "none"
) -> jax.Array:
    """REINFORCE advantage: A_i = r_i (`baseline='none'`, unbiased for ∇E[r]) or
    A_i = r_i − mean over all rollouts of the batch (`baseline='batch_mean'`).

    The batch-mean baseline includes the rollout itself, so it carries an O(1/R) bias.
    """
    return ADVANTAGE_ESTIMATORS["reinforce"](
        rewards, segment_ids, num_segments, baseline=baseline
    )


ADVANTAGE_ESTIMATORS: dict[str, AdvantageEstimator] = {
    e.name: e
    for e in (
        AdvantageEstimator("maxrl", _maxrl, True, 1, maxrl.__doc__ or ""),
        AdvantageEstimator(
            "maxrl_conditional", _maxrl_conditional, True, 0, maxrl_conditional.__doc__ or ""
        ),
        AdvantageEstimator("grpo", _grpo, False, None, grpo.__doc__ or ""),
        AdvantageEstimator("rloo", _rloo, False, None, rloo.__doc__ or ""),
        AdvantageEstimator("reinforce", _reinforce, False, None, reinforce.__doc__ or ""),
    )
}


def get_advantage_estimator(name: str) -> AdvantageEstimator:
    """The registered estimator `name`; call it as `est(rewards, segment_ids, num_segments)`."""
    try:
        return ADVANTAGE_ESTIMATORS[name]
    except KeyError:
        raise ValueError(
            f"estimator={name!r} is unknown; expected one of {sorted(ADVANTAGE_ESTIMATORS)}"
        ) from None


# ----------------------------------------------------------------------------- loss


def policy_gradient_loss(
    token_logprobs: jax.Array,
    token_mask: jax.Array,
    advantages: jax.Array,
    rollout_weights: jax.Array,
    *,
    aggregation: str = "token_mean",
    num_prompts: int | None = None,
    n0: int | None = None,
    max_len: int | None = None,
    num_tokens: jax.Array | float | None = None,
) -> jax.Array:
    """Scalar surrogate loss whose gradient is minus the (weighted) policy gradient.

    Inputs: token_logprobs / token_mask [R, T] (log π of each generated token; mask True on
    real tokens), advantages [R], rollout_weights [R] (w_r = N0/N_q, or 1 for the ablation;
    see `rollout_weights`). Advantages and weights are constants (stop_gradient).
    With c_r = w_r A_r, ℓ_r = Σ_t m_rt logπ_rt, |z_r| = Σ_t m_rt:

    * ``sequence_mean``: −(1/(P·N0)) Σ_r c_r ℓ_r/|z_r|. With w_q = N0/N_q this is
      −(1/P) Σ_q mean_{r∈q}(A_r ℓ_r/|z_r|): each prompt contributes its mean over its rollouts,
      divided by P (inactive prompts count in P and contribute 0) [SERA_SPEC §3].
    * ``seq_mean_token_sum_norm``: −(1/(P·N0)) Σ_r c_r ℓ_r / L, L = `max_len` (default T).
      Up to the constant 1/L this is the sequence-score estimator of the theory,
      S_r = ∇ Σ_t log π (Dr. GRPO's "fixed L").
    * ``token_mean`` (the published default): −Σ_r c_r ℓ_r / Σ_r |z_r| — every token's loss
      term times w_q, then the plain token mean. When the batch holds its budget of P·N0
      rollouts this is −(1/(P·N0)) Σ_r c_r ℓ_r / L̄ with L̄ the mean rollout length, so it
      reduces to the usual token-mean under uniform allocation. For gradient accumulation
      pass `num_tokens` = Σ|z_r| over the whole batch so that micro-batch losses add up.

    `num_prompts` (P, all prompts of the step) and `n0` (N0) are required for the two
    sequence modes; the normaliser P·N0 is fixed, so losses of micro-batches add up.
    """
    if aggregation not in AGGREGATIONS:
        raise ValueError(f"aggregation={aggregation!r} is unknown; expected one of {AGGREGATIONS}")
    lp = jnp.asarray(token_logprobs)
    mask = jnp.asarray(token_mask)
    advantages = jnp.asarray(advantages)
    rollout_weights = jnp.asarray(rollout_weights)
    _check_2d_with_mask("token_logprobs", lp, "token_mask", mask, "[R, T]")
    num_rows, width = lp.shape
    for name, x in (("advantages", advantages), ("rollout_weights", rollout_weights)):
        if x.shape != (num_rows,):
            raise ValueError(f"{name} has shape {x.shape}; expected ({num_rows},), one per row")
    if aggregation == "token_mean":
        norm, length = 1.0, 1
    else:
        if num_prompts is None or n0 is None:
            raise ValueError(f"aggregation={aggregation!r} needs num_prompts (P) and n0 (N0)")
        norm = float(_check_static_int("num_prompts", num_prompts, 1)
                     * _check_static_int("n0", n0, 1))
        length = width
        if aggregation == "seq_mean_token_sum_norm" and max_len is not None:
            length = _check_static_int("max_len", max_len, 1)
    if num_tokens is None:
        num_tokens = jnp.sum(mask)
    return _pg_loss(lp, mask, advantages, rollout_weights, jnp.asarray(num_tokens),
                    aggregation=aggregation, norm=norm, length=length)


@functools.partial(jax.jit, static_argnames=("aggregation", "norm", "length"))
def _pg_loss(
    lp: jax.Array,
    mask: jax.Array,
    advantages: jax.Array,
    weights: jax.Array,
    num_tokens: jax.Array,
    *,
    aggregation: str,
    norm: float,
    length: int,
) -> jax.Array:
    coef = jax.lax.stop_gradient(advantages * weights).astype(lp.dtype)
    # where, not multiply: padded log-probs may be -inf or NaN, and 0 * inf = NaN.
    seq_sum = jnp.sum(jnp.where(mask, lp, 0.0), axis=1)
    if aggregation == "token_mean":
        return -jnp.sum(coef * seq_sum) / jnp.maximum(num_tokens.astype(lp.dtype), 1.0)
    if aggregation == "sequence_mean":
        lengths = jnp.sum(mask, axis=1).astype(lp.dtype)
        return -jnp.sum(coef * seq_sum / jnp.maximum(lengths, 1.0)) / norm
    return -jnp.sum(coef * seq_sum) / (norm * length)
