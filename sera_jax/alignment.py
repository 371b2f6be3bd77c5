"""Image classification as one-step RL: the allocated MaxRL gradient vs the exact gradient.

A classifier is a one-step policy (SERA_SPEC §7): a rollout of image q is a label c drawn
from softmax(logits_q), reward r = 1{c = y_q}, and the success probability is known exactly,
p_q = softmax(logits_q)[y_q]. The exact likelihood gradient is the gradient of the mean
cross-entropy on the same minibatch.

Cost does not grow with the number of rollouts beyond O(B + P·C) array work:

* logits are computed once; the B = P·N0 rollout labels are drawn from them (no network
  pass per rollout);
* the score of label c with respect to the logits is e_c − softmax(logits_q), so the
  gradient of the MaxRL surrogate loss with respect to the *logits* (the "logit-space
  cotangent", [P, C]) is formed directly from the rollouts, and ONE vector-Jacobian product
  of the network carries it to the parameters, whatever N0 is. Many cotangents (draws,
  allocators) share one forward pass (`gradient_alignment`).

Signs: every gradient here is the gradient of a *loss* (RL surrogate or mean CE), so the
two are aligned when their cosine is +1.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from sera_jax import estimators, metrics, scaling
from sera_jax import methods as methods_lib

# ----------------------------------------------------------------------------- exact p


def success_probs(logits: Any, labels: Any) -> np.ndarray:
    """p_q = softmax(logits_q)[y_q] in float64 on the host, clipped to [tiny, 1 − ulp].

    Computed as exp(z_y − logsumexp(z)) in float64 from the float32 logits, so probabilities
    far below float32's range (ImageNet reaches 1e-300) stay exact and positive; the clip
    keeps κ and the allocators' log1p/expm1 finite (SERA_SPEC §4, "Oracle").
    """
    z = np.asarray(logits, np.float64)
    y = np.asarray(labels)
    if z.ndim != 2:
        raise ValueError(f"logits must be [P, C]; got shape {z.shape}")
    if y.shape != (z.shape[0],) or not np.issubdtype(y.dtype, np.integer):
        raise ValueError(f"labels must be integers of shape ({z.shape[0]},); got {y.dtype}"
                         f"{list(y.shape)}")
    if y.size and (y.min() < 0 or y.max() >= z.shape[1]):
        raise ValueError(f"labels must lie in [0, {z.shape[1]}); got {y.min()}..{y.max()}")
    m = z.max(axis=1, keepdims=True)
    lse = (m + np.log(np.sum(np.exp(z - m), axis=1, keepdims=True)))[:, 0]
    p = np.exp(z[np.arange(len(y)), y] - lse)
    return np.clip(p, np.finfo(np.float64).tiny, np.nextafter(1.0, 0.0))


# ----------------------------------------------------------------------------- methods


@dataclasses.dataclass(frozen=True)
class AllocatedBatch:
    """Host-side result of one allocator on one batch (NumPy arrays, shape [P])."""

    counts: np.ndarray  # int32, sum == budget
    weights: np.ndarray  # float32: N0/N_q on active prompts (1 for the ablation), 0 inactive
    kappa: np.ndarray  # float64 κ(p_q, N_q, shift); 0 for inactive prompts
    active: np.ndarray  # bool

    @property
    def kappa_min(self) -> float:
        """Smallest realised scale factor over the active prompts."""
        return float(self.kappa[self.active].min()) if self.active.any() else 0.0

    @property
    def kappa_mean(self) -> float:
        """Mean realised scale factor over the active prompts."""
        return float(self.kappa[self.active].mean()) if self.active.any() else 0.0

    @property
    def active_frac(self) -> float:
        return float(self.active.mean())


def allocate_batch(name: str, p: np.ndarray, n0: int, *, n_min: int, n_max: int,
                   threshold: float | None = None, shift: int = 1) -> AllocatedBatch:
    """Run method `name` (a key of `sera_jax.methods.METHODS`) with budget P·n0 on exact p.

    `threshold` (θ of the dynamic active set) overrides the preset of the methods whose
    allocator uses it (SERA's dynamic variants) and is not passed to the others.
    """
    method = methods_lib.get_method(name)
    if threshold is not None and "threshold" in method.options:
        method = methods_lib.resolve(name, {"threshold": threshold})
    p = np.asarray(p, np.float64)
    budget = int(p.shape[0]) * int(n0)
    # float64 inside the allocator: p reaches 1e-300 (SERA_SPEC §4, "Oracle").
    with jax.enable_x64(True):
        alloc = jax.device_get(method.allocate(p, budget, n_min=n_min, n_max=n_max,
                                               shift=shift))
        kappa = np.asarray(scaling.kappa(p, np.asarray(alloc.counts), shift=shift), np.float64)
    counts = np.asarray(alloc.counts, np.int32)
    active = counts > 0
    weights = method.prompt_weights(counts, np.asarray(alloc.weights, np.float32))
    kappa = np.where(active, kappa, 0.0)
    return AllocatedBatch(counts=counts, weights=weights, kappa=kappa, active=active)


# ----------------------------------------------------------------------------- cotangents


def ce_logit_cotangent(logits: jax.Array, labels: jax.Array) -> jax.Array:
    """∂/∂logits of mean_q CE(logits_q, y_q) = (softmax(logits_q) − e_{y_q}) / P."""
    return jax.grad(
        lambda z: optax.softmax_cross_entropy_with_integer_labels(z, labels).mean())(logits)


def sample_rollouts(key: jax.Array, logits: jax.Array, counts: jax.Array, budget: int
                    ) -> tuple[jax.Array, jax.Array]:
    """`(segment_ids, labels)` of the B = `budget` rollouts: image q gets counts[q] labels
    drawn i.i.d. from softmax(logits_q) (Gumbel-max on the logits: exact for tiny p)."""
    segment_ids = estimators.segment_ids_from_counts(counts, budget)
    labels = jax.random.categorical(key, logits[segment_ids], axis=-1)
    return segment_ids, labels.astype(jnp.int32)


def maxrl_logit_cotangent(key: jax.Array, logits: jax.Array, labels: jax.Array,
                          counts: jax.Array, weights: jax.Array, *, n0: int) -> jax.Array:
    """∂/∂logits of the SERA/MaxRL surrogate loss on freshly sampled rollouts, [P, C].

    loss = −(1/(P·N0)) Σ_r w_{q(r)} A_r log softmax(logits_{q(r)})[c_r] with A the centred
    MaxRL advantage (`estimators.maxrl`) and the sequence-mean aggregation of
    `estimators.policy_gradient_loss` (one token per rollout). Since
    ∂ log softmax(z)[c] / ∂z = e_c − softmax(z), this is
    −(1/(P·N0)) Σ_q w_q Σ_{r∈q} A_r (e_{c_r} − softmax(z_q)): O(B + P·C), no network pass.
    The parameter gradient is the VJP of the network with this cotangent.
    """
    num_prompts = logits.shape[0]
    budget = num_prompts * n0
    segment_ids, rollout_labels = sample_rollouts(key, logits, counts, budget)
    rewards = (rollout_labels == labels[segment_ids]).astype(jnp.float32)
    adv = estimators.maxrl(rewards, segment_ids, num_prompts)
    w = estimators.rollout_weights(weights, segment_ids)

    def loss(z):
        lp = jax.nn.log_softmax(z, axis=-1)[segment_ids, rollout_labels]
        return estimators.policy_gradient_loss(
            lp[:, None], jnp.ones((budget, 1), bool), adv, w, aggregation="sequence_mean",
            num_prompts=num_prompts, n0=n0)

    return jax.grad(loss)(logits)


def expected_logit_cotangent(logits: jax.Array, labels: jax.Array, kappa: jax.Array,
                             counts: jax.Array, weights: jax.Array, n0: int) -> jax.Array:
    """E over rollouts of `maxrl_logit_cotangent` (ignoring ε), [P, C].

    Each group's mean (1/N_q)Σ A_r S_r has expectation κ(p_q, N_q)∇log p_q (SERA_SPEC §2)
    and enters the loss with weight w_q N_q/(P·N0), so the expected cotangent is
    −(w_q N_q κ_q / (P·N0)) (e_{y_q} − softmax(z_q)). Its cosine to the exact gradient is the
    alignment of the allocator's *bias* alone (no sampling noise).
    """
    num_prompts = logits.shape[0]
    scale = weights * counts.astype(weights.dtype) * kappa.astype(weights.dtype) / (
        num_prompts * n0)
    score = jax.nn.one_hot(labels, logits.shape[-1]) - jax.nn.softmax(logits, axis=-1)
    return -scale[:, None] * score


# ----------------------------------------------------------------------------- alignment


@jax.jit
def _aligned_chunk(vjp_fn: Callable, cotangents: jax.Array, g_exact: Any
                   ) -> tuple[jax.Array, jax.Array]:
    # A Python loop, unrolled under jit: XLA:CPU runs convolutions inside while-loops
    # (lax.map / scan) and vmapped weight gradients several times slower than plain ones.
    exact_norm = optax.global_norm(g_exact)
    cos, ratio = [], []
    for i in range(cotangents.shape[0]):
        g = vjp_fn(cotangents[i])[0]
        cos.append(metrics.cosine(g, g_exact))
        ratio.append(optax.global_norm(g) / exact_norm)
    return jnp.stack(cos), jnp.stack(ratio)


@jax.jit
def _apply_vjp(vjp_fn: Callable, cotangent: jax.Array) -> Any:
    return vjp_fn(cotangent)[0]


def gradient_alignment(vjp_fn: Callable, cotangents: Any, exact_cotangent: jax.Array, *,
                       unroll: int = 4) -> tuple[np.ndarray, np.ndarray]:
    """Cosine and norm ratio of J^T G_m to J^T G_exact for a stack of logit cotangents.

    `vjp_fn` is the pullback of `logits_fn(params) -> logits [P, C]` from `jax.vjp`, made
    under `jax.jit` (so its residuals are device arrays): ONE forward pass serves the exact
    gradient and all M = len(cotangents) estimates. Each estimate costs one backward pass;
    `unroll` of them are compiled into one program (the last chunk is zero-padded, so there
    is one compilation). Returns NumPy (cosine [M], ‖g_m‖/‖g_exact‖ [M]).
    """
    if unroll < 1:
        raise ValueError(f"unroll={unroll}; must be >= 1")
    g_exact = _apply_vjp(vjp_fn, exact_cotangent)
    m = cotangents.shape[0]
    cos, ratio = [], []
    for i in range(0, m, unroll):
        chunk = cotangents[i:i + unroll]
        if chunk.shape[0] < unroll:
            chunk = jnp.concatenate([chunk, jnp.zeros((unroll - chunk.shape[0],)
                                                      + chunk.shape[1:], chunk.dtype)])
        c, r = _aligned_chunk(vjp_fn, chunk, g_exact)
        cos.append(c)
        ratio.append(r)
    return (np.concatenate(jax.device_get(cos))[:m], np.concatenate(jax.device_get(ratio))[:m])


def param_gradient(logits_fn: Callable[[Any], jax.Array], params: Any,
                   cotangent: jax.Array) -> Any:
    """Parameter gradient J^T G of one logit cotangent (one forward + one backward pass)."""
    _, vjp_fn = jax.vjp(logits_fn, params)
    return vjp_fn(cotangent)[0]


def analytic_pass_curve(p: np.ndarray, ks: Sequence[int]) -> dict[int, float]:
    """Mean analytic pass@k = mean_q 1 − (1 − p_q)^k for each k (`metrics.analytic_pass_at_k`)."""
    return {int(k): float(np.mean(metrics.analytic_pass_at_k(p, k))) for k in ks}
