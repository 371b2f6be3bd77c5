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

Rollout j of image q draws its label with the key `fold_in(fold_in(key, q), j)`
(`rollout_labels`), so draws are paired across methods image by image (common random
numbers). A two-stage method (`Method.two_stage`, e.g. `sera_sequential`) is measured with
the lab's protocol: its pilot is rollouts 0..m−1 of every image (`pilot_successes`, m =
`Method.pilot_size(n_min)`), the allocator gets their successes (`allocate_batch(...,
pilot_successes=K1)`, one allocation per draw), and the cotangent then draws rollouts
0..N_q−1 with the same key -- the pilot included, with the multiplicity weights N0/N_q of the
realised counts. E[cotangent | pilot] is `expected_logit_cotangent` with the scale given the
pilot (`Method.expected_scale`, i.e. `allocation.beyond.conditional_scale`).

Signs: every gradient here is the gradient of a *loss* (RL surrogate or mean CE), so the
two are aligned when their cosine is +1.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from sera_jax import methods as methods_lib
from sera_jax import metrics, objective

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


#: Draws whose other images' pilots are averaged over in a two-stage method's E[c_q]
#: (`allocate_batch`): image q's own pilot is enumerated exactly, so few are needed.
PILOT_AVERAGE_DRAWS = 32


@dataclasses.dataclass(frozen=True)
class AllocatedBatch:
    """Host-side result of one method on one batch (NumPy arrays, shape [P], or [R, P] for a
    two-stage method: one allocation per draw R, each after that draw's pilot).

    `kappa` is E[scale | allocation] (`Method.expected_scale`): κ(p_q, N_q) one-shot, the
    scale given the draw's pilot two-stage. A two-stage batch also carries the pilot averaged
    out, per image: `kappa_bar` = E[c_q] (comparable with a one-shot κ(p, N_q), which is
    E[c_q] for fixed counts) and `cot_scale` = E[w_q N_q c_q]/N0 (the expected cotangent's
    scale, = `kappa_bar` with the weights N0/N_q).
    """

    counts: np.ndarray  # int32, sum == budget (per draw)
    weights: np.ndarray  # float32: N0/N_q on active prompts (1 for the ablation), 0 inactive
    kappa: np.ndarray  # float64 E[scale | allocation]; 0 for inactive prompts
    active: np.ndarray  # bool
    kappa_bar: np.ndarray | None = None  # float64 [P], two-stage only
    cot_scale: np.ndarray | None = None  # float64 [P], two-stage only

    @property
    def num_draws(self) -> int:
        """R for a per-draw (two-stage) allocation, 0 for one allocation shared by all draws."""
        return 0 if self.counts.ndim == 1 else int(self.counts.shape[0])

    def draw(self, r: int) -> AllocatedBatch:
        """The allocation that draw r uses ([P] arrays; itself for a one-shot method)."""
        if not self.num_draws:
            return self
        return AllocatedBatch(self.counts[r], self.weights[r], self.kappa[r], self.active[r])

    def _scale_over_active(self) -> np.ndarray:
        """The per-image scale the κ diagnostics summarise: κ, or κ̄ for a two-stage batch."""
        if not self.num_draws or self.kappa_bar is None:
            return self.kappa[self.active]
        return self.kappa_bar[self.active.any(axis=0)]

    @property
    def kappa_min(self) -> float:
        """Smallest scale factor over the active prompts (E[c_q] for a two-stage batch)."""
        k = self._scale_over_active()
        return float(k.min()) if k.size else 0.0

    @property
    def kappa_mean(self) -> float:
        """Mean scale factor over the active prompts (E[c_q] for a two-stage batch)."""
        k = self._scale_over_active()
        return float(k.mean()) if k.size else 0.0

    @property
    def active_frac(self) -> float:
        return float(self.active.mean())


def allocate_batch(name: str, p: np.ndarray, n0: int, *, n_min: int, n_max: int,
                   threshold: float | None = None, shift: int = 1,
                   pilot_successes: np.ndarray | None = None,
                   pilot_average_draws: int = PILOT_AVERAGE_DRAWS) -> AllocatedBatch:
    """Run method `name` (a key of `sera_jax.methods.METHODS`) with budget P·n0 on exact p.

    `threshold` (θ of the dynamic active set) overrides the preset of the methods whose
    allocator uses it (SERA's dynamic variants) and is not passed to the others. A two-stage
    method needs `pilot_successes`, int [P] or [R, P] with values in [0, m], m =
    `Method.pilot_size(n_min)` (from `pilot_successes(...)`: rollouts 0..m−1 of every image);
    the result then has the same shape (one allocation per draw, vmapped). For [R, P] it also
    has `kappa_bar` and `cot_scale`: image q's own pilot K¹_q ~ Binomial(m, p_q) enumerated
    exactly, the other images' pilots (which move N_q only through the shared allocation)
    averaged over the first `pilot_average_draws` draws:
    E[f_q] = Σ_k Binom(k; m, p_q) · mean_r f(p_q, k, N_q(K¹_r with K¹_{r,q} := k)).
    """
    method = methods_lib.get_method(name)
    if threshold is not None and "threshold" in method.options:
        method = methods_lib.resolve(name, {"threshold": threshold})
    p = np.asarray(p, np.float64)
    k1 = _check_pilot(method, pilot_successes, p.shape[0], n_min)
    counts, weights, kappa = _allocate_arrays(method, p, n0, k1, n_min, n_max, shift)
    out = AllocatedBatch(counts=counts, weights=weights, kappa=kappa, active=counts > 0)
    if k1 is None or k1.ndim == 1:
        return out
    if isinstance(pilot_average_draws, bool) or not (
            isinstance(pilot_average_draws, int | np.integer) and pilot_average_draws >= 1):
        raise ValueError(f"pilot_average_draws={pilot_average_draws!r}; must be an int >= 1")
    kappa_bar, cot_scale = _own_pilot_averaged(method, p, n0, k1[:pilot_average_draws], n_min,
                                               n_max, shift)
    return dataclasses.replace(out, kappa_bar=kappa_bar, cot_scale=cot_scale)


def _allocate_arrays(method: methods_lib.Method, p: np.ndarray, n0: int, k1: Any, n_min: int,
                     n_max: int, shift: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(counts int32, weights float32, kappa float64) of `method` on p, per pilot row of k1
    (vmapped; None = one-shot), inactive prompts' kappa 0."""
    budget = int(p.shape[0]) * int(n0)
    kw = dict(n_min=n_min, n_max=n_max, shift=shift)
    # float64 inside the allocator: p reaches 1e-300 (SERA_SPEC §4, "Oracle").
    with jax.enable_x64(True):
        if k1 is None:
            alloc = method.allocate(p, budget, **kw)
        else:
            one = lambda k: method.allocate(p, budget, pilot_successes=k, **kw)  # noqa: E731
            alloc = one(k1) if k1.ndim == 1 else jax.vmap(one)(k1)
        counts = np.asarray(jax.device_get(alloc.counts), np.int32)
        kappa = np.asarray(method.expected_scale(p, counts, n_min=n_min, pilot_successes=k1,
                                                 shift=shift), np.float64)
    weights = method.prompt_weights(counts, np.asarray(jax.device_get(alloc.weights),
                                                       np.float32))
    return counts, weights, np.where(counts > 0, kappa, 0.0)


def _own_pilot_averaged(method: methods_lib.Method, p: np.ndarray, n0: int, k1: np.ndarray,
                        n_min: int, n_max: int, shift: int) -> tuple[np.ndarray, np.ndarray]:
    """(E[c_q], E[w_q N_q c_q]/N0) per image: own pilot enumerated, the rest from k1's rows
    (see `allocate_batch`); R'·P·(m+1) allocations in one vmapped call."""
    m, (rows, num) = method.pilot_size(n_min), k1.shape
    q, ks = np.arange(num), np.arange(m + 1)
    sub = np.array(np.broadcast_to(k1[:, None, None, :], (rows, num, m + 1, num)))
    sub[:, q, :, q] = ks  # row (r, q, k): draw r's pilot with image q's successes set to k
    counts, weights, kappa = _allocate_arrays(method, p, n0, sub.reshape(-1, num), n_min,
                                              n_max, shift)
    own = lambda x: x.reshape(rows, num, m + 1, num)[:, q, :, q]  # noqa: E731 -> [P, R', m+1]
    c = own(kappa)
    wnc = own(weights.astype(np.float64) * counts * kappa) / n0
    binom = np.array([math.comb(m, k) for k in ks]) * p[:, None] ** ks * (1 - p[:, None]) ** (
        m - ks)
    return np.sum(binom * c.mean(1), 1), np.sum(binom * wnc.mean(1), 1)


def _check_pilot(method: methods_lib.Method, k1: Any, num: int, n_min: int
                 ) -> np.ndarray | None:
    """`pilot_successes` as int32 after checking it fits `method` (None for a one-shot one)."""
    if not method.two_stage:
        if k1 is not None:
            raise ValueError(f"method {method.name!r} allocates before any rollout; "
                             "pilot_successes is only for two-stage methods")
        return None
    m = method.pilot_size(n_min)
    if k1 is None:
        raise ValueError(f"method {method.name!r} is two-stage: draw its pilot of {m} "
                         "rollouts per image first and pass pilot_successes=... "
                         "(alignment.pilot_successes)")
    k1 = np.asarray(k1)
    if k1.ndim not in (1, 2) or k1.shape[-1] != num or not np.issubdtype(k1.dtype, np.integer):
        raise ValueError(f"pilot_successes must be integers of shape ({num},) or (R, {num}); "
                         f"got {k1.dtype}{list(k1.shape)}")
    if k1.size and (k1.min() < 0 or k1.max() > m):
        raise ValueError(f"pilot_successes must lie in [0, pilot={m}]; got "
                         f"{k1.min()}..{k1.max()}")
    return k1.astype(np.int32)


# ----------------------------------------------------------------------------- cotangents


def ce_logit_cotangent(logits: jax.Array, labels: jax.Array) -> jax.Array:
    """∂/∂logits of mean_q CE(logits_q, y_q) = (softmax(logits_q) − e_{y_q}) / P."""
    return jax.grad(
        lambda z: optax.softmax_cross_entropy_with_integer_labels(z, labels).mean())(logits)


def rollout_labels(key: jax.Array, logits: jax.Array, images: jax.Array, ranks: jax.Array
                   ) -> jax.Array:
    """Label of rollout `ranks[r]` of image `images[r]`, for every r: a draw from
    softmax(logits_q) (Gumbel-max on the logits: exact for tiny p) with its own key
    `fold_in(fold_in(key, q), j)`.

    Rollout j of image q depends on (key, q, j) only, never on the other images' counts, so
    methods that give image q N and N' rollouts share its first min(N, N') labels (common
    random numbers), and a two-stage method's pilot is rollouts 0..m−1 of its final ones.
    """
    def one(q, j):
        k = jax.random.fold_in(jax.random.fold_in(key, q), j)
        return jax.random.categorical(k, logits[q])

    return jax.vmap(one)(images, ranks).astype(jnp.int32)


def sample_rollouts(key: jax.Array, logits: jax.Array, plan: objective.RolloutPlan
                    ) -> jax.Array:
    """Labels [B] of the plan's rollouts: row r is rollout `plan.ranks[r]` of image
    `plan.segment_ids[r]` (`rollout_labels`)."""
    return rollout_labels(key, logits, plan.segment_ids, plan.ranks)


@functools.partial(jax.jit, static_argnames="pilot")
def _pilot_successes(keys: jax.Array, logits: jax.Array, labels: jax.Array, pilot: int
                     ) -> jax.Array:
    num = logits.shape[0]
    images = jnp.repeat(jnp.arange(num), pilot)
    ranks = jnp.tile(jnp.arange(pilot), num)

    def one(key):
        hits = rollout_labels(key, logits, images, ranks) == labels[images]
        return jnp.sum(hits.reshape(num, pilot), axis=1, dtype=jnp.int32)

    return jax.vmap(one)(keys)


def pilot_successes(keys: jax.Array, logits: jax.Array, labels: jax.Array, pilot: int
                    ) -> np.ndarray:
    """K¹ [R, P] (host int32): successes among rollouts 0..pilot−1 of every image, for each
    draw key of `keys` [R] -- the first rollouts `maxrl_logit_cotangent` draws with that key,
    so the pilot is part of the final rollouts (the protocol of `sera_jax.studies.lab.train`)."""
    if isinstance(pilot, bool) or not isinstance(pilot, int | np.integer) or pilot < 1:
        raise ValueError(f"pilot={pilot!r}; must be an integer >= 1")
    return np.asarray(jax.device_get(_pilot_successes(keys, logits, labels, int(pilot))))


def maxrl_logit_cotangent(key: jax.Array, logits: jax.Array, labels: jax.Array,
                          counts: jax.Array, weights: jax.Array, *, n0: int) -> jax.Array:
    """∂/∂logits of the SERA/MaxRL surrogate loss on freshly sampled rollouts, [P, C].

    loss = −(1/(P·N0)) Σ_r w_{q(r)} A_r log softmax(logits_{q(r)})[c_r] with A the centred
    MaxRL advantage and the sequence-mean aggregation (`objective.surrogate_loss`, the
    trainer's, one token per rollout; w_q = `weights`, the plan of `counts`). Since
    ∂ log softmax(z)[c] / ∂z = e_c − softmax(z), this is
    −(1/(P·N0)) Σ_q w_q Σ_{r∈q} A_r (e_{c_r} − softmax(z_q)): O(B + P·C), no network pass.
    The parameter gradient is the VJP of the network with this cotangent.
    """
    plan = objective.plan_from_counts(counts, weights, logits.shape[0] * n0)
    sampled = sample_rollouts(key, logits, plan)
    rewards = (sampled == labels[plan.segment_ids]).astype(jnp.float32)

    def loss(z):
        lp = jax.nn.log_softmax(z, axis=-1)[plan.segment_ids, sampled]
        return objective.surrogate_loss(lp, rewards, plan, estimator="maxrl",
                                        aggregation="sequence_mean", n0=n0)

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
    weights = jnp.asarray(weights)
    scale = weights * jnp.asarray(counts).astype(weights.dtype) * jnp.asarray(kappa).astype(
        weights.dtype) / (num_prompts * n0)
    score = jax.nn.one_hot(labels, logits.shape[-1]) - jax.nn.softmax(logits, axis=-1)
    return -scale[:, None] * score


def expected_cotangent_of(alloc: AllocatedBatch, logits: jax.Array, labels: jax.Array, n0: int
                          ) -> jax.Array:
    """`expected_logit_cotangent` of a method's allocation, [P, C].

    One-shot: E over rollouts given the fixed counts. Two-stage ([R, P] arrays): over the
    pilots too, E[cotangent] = −(1/P) Σ_q `cot_scale`_q (e_{y_q} − softmax(z_q)), with
    `cot_scale` = E[w_q N_q c_q]/N0 from `allocate_batch`.
    """
    if not alloc.num_draws:
        return expected_logit_cotangent(logits, labels, alloc.kappa, alloc.counts,
                                        alloc.weights, n0)
    if alloc.cot_scale is None:
        raise ValueError("a per-draw allocation needs its cot_scale (allocate_batch with "
                         "pilot_successes of shape [R, P])")
    scale = alloc.cot_scale
    return expected_logit_cotangent(logits, labels, jnp.asarray(scale, jnp.float32),
                                    jnp.ones(scale.shape, jnp.int32),
                                    jnp.ones(scale.shape, jnp.float32), 1)


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
