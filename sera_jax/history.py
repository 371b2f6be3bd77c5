"""Per-prompt success history: a discounted Beta posterior, frozen within an epoch.

SERA_SPEC §4 [paper]. For each prompt id (the stable dataset index, 0..M−1):

* during an epoch, verifier outcomes only accumulate into `pending_*` (so an allocation
  never sees outcomes of its own epoch: no within-epoch leakage);
* at each epoch start, `S ← γS + pending_S`, `F ← γF + pending_F`, pending is cleared and
  the frozen estimate becomes `p̂ = (α + S)/(α + β + S + F)`.

A prompt is *seen* once some outcome of it has been folded in by `start_epoch`; `lookup`
returns NaN for unseen prompts, which is what `sera_jax.allocation` reads as "no estimate".

The state is a `flax.struct` dataclass of arrays (no dicts, no Python state), so `update`
and `lookup` are jit-able and the whole thing is a pytree that Orbax checkpoints as is.
Typical use per epoch: `h = start_epoch(h)`; per step: `p = lookup(h, ids)`, allocate,
sample, verify, `h = update_from_rollouts(h, ids, segment_ids, rewards)`.
"""

from __future__ import annotations

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from sera_jax.estimators import _check_segment_ids, _is_concrete


@flax.struct.dataclass
class SuccessHistory:
    """Discounted Beta posterior per prompt id (all fields are arrays; M = num_prompts)."""

    successes: jax.Array  # float32[M]: discounted successes S folded in at epoch starts
    failures: jax.Array  # float32[M]: discounted failures F
    pending_successes: jax.Array  # float32[M]: successes of the running epoch
    pending_failures: jax.Array  # float32[M]: failures of the running epoch
    p_hat: jax.Array  # float32[M]: frozen (α + S)/(α + β + S + F) from the last epoch start
    seen: jax.Array  # bool[M]: some outcome has been folded in
    alpha: jax.Array  # float32[]: Beta prior successes α
    beta: jax.Array  # float32[]: Beta prior failures β
    gamma: jax.Array  # float32[]: per-epoch discount γ

    @classmethod
    def create(
        cls, num_prompts: int, alpha: float = 0.5, beta: float = 0.5, gamma: float = 0.75
    ) -> SuccessHistory:
        """Empty history over prompt ids 0..num_prompts−1 (every prompt unseen)."""
        if isinstance(num_prompts, bool) or not isinstance(num_prompts, int | np.integer):
            raise ValueError(f"num_prompts={num_prompts!r} must be an integer >= 1")
        if num_prompts < 1:
            raise ValueError(f"num_prompts={num_prompts} must be >= 1")
        if not alpha > 0:
            raise ValueError(f"alpha={alpha!r} must be > 0")
        if not beta > 0:
            raise ValueError(f"beta={beta!r} must be > 0")
        if not 0.0 <= gamma <= 1.0:
            raise ValueError(f"gamma={gamma!r} must be in [0, 1]")
        zeros = jnp.zeros((int(num_prompts),), jnp.float32)
        return cls(
            successes=zeros,
            failures=zeros,
            pending_successes=zeros,
            pending_failures=zeros,
            p_hat=jnp.full_like(zeros, alpha / (alpha + beta)),
            seen=jnp.zeros((int(num_prompts),), jnp.bool_),
            alpha=jnp.asarray(alpha, jnp.float32),
            beta=jnp.asarray(beta, jnp.float32),
            gamma=jnp.asarray(gamma, jnp.float32),
        )

    @property
    def num_prompts(self) -> int:
        return self.successes.shape[0]


def _check_prompt_ids(prompt_ids: jax.Array, num_prompts: int) -> None:
    if prompt_ids.ndim != 1 or not jnp.issubdtype(prompt_ids.dtype, jnp.integer):
        raise ValueError(
            "prompt_ids must be a 1-D integer array; "
            f"got {prompt_ids.dtype}{list(prompt_ids.shape)}"
        )
    if _is_concrete(prompt_ids) and prompt_ids.size:
        host = np.asarray(prompt_ids)
        lo, hi = int(host.min()), int(host.max())
        if lo < 0 or hi >= num_prompts:
            raise ValueError(
                f"prompt_ids contains {lo if lo < 0 else hi}; allowed range is "
                f"[0, num_prompts={num_prompts})"
            )


@jax.jit
def start_epoch(h: SuccessHistory) -> SuccessHistory:
    """Fold the pending outcomes in and freeze p̂ for the new epoch.

    S ← γS + pending_S, F ← γF + pending_F, p̂ = (α + S)/(α + β + S + F), pending ← 0.
    """
    s = h.gamma * h.successes + h.pending_successes
    f = h.gamma * h.failures + h.pending_failures
    zeros = jnp.zeros_like(s)
    return h.replace(
        successes=s,
        failures=f,
        pending_successes=zeros,
        pending_failures=zeros,
        p_hat=(h.alpha + s) / (h.alpha + h.beta + s + f),
        seen=h.seen | (h.pending_successes + h.pending_failures > 0),
    )


def update(
    h: SuccessHistory, prompt_ids: jax.Array, successes: jax.Array, trials: jax.Array
) -> SuccessHistory:
    """Add outcomes to the *pending* counts only (p̂ stays frozen until `start_epoch`).

    prompt_ids [M'] (repeats accumulate, so per-rollout rows with trials = 1 work as well as
    per-prompt totals), successes [M'] and trials [M'] with 0 <= successes <= trials.
    """
    prompt_ids = jnp.asarray(prompt_ids)
    successes = jnp.asarray(successes, jnp.float32)
    trials = jnp.asarray(trials, jnp.float32)
    _check_prompt_ids(prompt_ids, h.num_prompts)
    for name, x in (("successes", successes), ("trials", trials)):
        if x.shape != prompt_ids.shape:
            raise ValueError(f"{name} has shape {x.shape}; expected {prompt_ids.shape}")
    if _is_concrete(successes, trials):
        s, t = np.asarray(successes), np.asarray(trials)
        bad = ~(np.isfinite(s) & np.isfinite(t) & (s >= 0) & (s <= t))
        if bad.any():
            i = int(np.argmax(bad))
            raise ValueError(
                f"successes[{i}]={s[i]!r}, trials[{i}]={t[i]!r}: need 0 <= successes <= trials"
            )
    return _add_pending(h, prompt_ids, successes, trials)


@jax.jit
def _add_pending(
    h: SuccessHistory, prompt_ids: jax.Array, successes: jax.Array, trials: jax.Array
) -> SuccessHistory:
    return h.replace(
        pending_successes=h.pending_successes.at[prompt_ids].add(successes),
        pending_failures=h.pending_failures.at[prompt_ids].add(trials - successes),
    )


def update_from_rollouts(
    h: SuccessHistory,
    batch_prompt_ids: jax.Array,
    segment_ids: jax.Array,
    rewards: jax.Array,
) -> SuccessHistory:
    """`update` from a flat rollout batch: prompt q of the batch has id batch_prompt_ids[q],
    rollout r belongs to prompt segment_ids[r] in [0, P) and earned rewards[r] in [0, 1].

    Successes and trials are segment sums, so prompts with no rollouts add nothing.
    """
    batch_prompt_ids = jnp.asarray(batch_prompt_ids)
    rewards = jnp.asarray(rewards, jnp.float32)
    segment_ids = jnp.asarray(segment_ids)
    _check_prompt_ids(batch_prompt_ids, h.num_prompts)
    num_batch = batch_prompt_ids.shape[0]
    if rewards.ndim != 1:
        raise ValueError(f"rewards must be 1-D [R]; got shape {rewards.shape}")
    _check_segment_ids(segment_ids, rewards.shape[0], num_batch)
    if _is_concrete(rewards):
        host = np.asarray(rewards)
        if not np.all((host >= 0) & (host <= 1)):
            raise ValueError("rewards must lie in [0, 1] (verifier outcomes); got values outside")
    return _add_rollouts(h, batch_prompt_ids, segment_ids, rewards)


@jax.jit
def _add_rollouts(
    h: SuccessHistory, batch_prompt_ids: jax.Array, segment_ids: jax.Array, rewards: jax.Array
) -> SuccessHistory:
    num_batch = batch_prompt_ids.shape[0]
    successes = jax.ops.segment_sum(rewards, segment_ids, num_batch)
    trials = jax.ops.segment_sum(jnp.ones_like(rewards), segment_ids, num_batch)
    return _add_pending(h, batch_prompt_ids, successes, trials)


def lookup(h: SuccessHistory, prompt_ids: jax.Array) -> jax.Array:
    """Frozen p̂ of each prompt id (float32), NaN for prompts never folded in."""
    prompt_ids = jnp.asarray(prompt_ids)
    _check_prompt_ids(prompt_ids, h.num_prompts)
    return _lookup(h, prompt_ids)


@jax.jit
def _lookup(h: SuccessHistory, prompt_ids: jax.Array) -> jax.Array:
    return jnp.where(h.seen[prompt_ids], h.p_hat[prompt_ids], jnp.nan)
