"""The lab's training run: every seed of one method as ONE compiled program (vmap over seeds).

One step of one seed, with the library's pieces unchanged (the same order as the RL trainer,
`sera_jax.rl.trainer`):

1. at an epoch start (every M/P steps) `history.start_epoch` folds the pending outcomes in
   and freezes p̂; the batch is the next P prompt ids of the epoch's permutation;
2. p̂ = `history.lookup` (NaN = unseen);
3. the method's allocator (`Method.allocate`, i.e. `allocation.ALLOCATORS[...]`, traced
   inside the vmap) spends B = P·N0 rollouts; a two-stage allocator
   (`sera_jax.allocation.beyond.TWO_STAGE`) first draws its pilot -- rollouts 0..m−1 of
   every batch prompt -- and gets their successes; allocators with Beta-posterior options
   (alpha, beta) get the history's frozen posterior (α + S, β + F) when
   `posterior_from_history`;
4. per-prompt loss weights `Method.prompt_weights` (the registry's function, traced into the
   step: no host round-trip);
5. rollouts: row r of the flat batch (`estimators.segment_ids_from_counts`) is rollout j of
   its prompt x and draws its answer by inverse CDF from the uniform U_t[x, j];
6. ragged advantages (`estimators.get_advantage_estimator(method.estimator)`), per-rollout
   weights (`estimators.rollout_weights`), the loss (`estimators.policy_gradient_loss`),
   AdamW after global-norm clipping (optax);
7. `history.update_from_rollouts` (pending until the next epoch).

Pairing: for a seed, the task instance, the initial policy, the data order and the uniforms
U_t[x, j] depend on the seed only, never on the method; so two methods that give prompt x the
same N at step t with the same policy draw the same answers.

Exact diagnostics per step (the policy is small, so everything is exact): the cosine of the
step's policy gradient to the exact ∇ mean_batch log p, the realised κ(p_q, N_q) over active
prompts (exact p), |p̂ − p|; every `eval_every` steps analytic pass@k on the train and the
held-out prompts.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
from jax import Array, lax

from sera_jax import allocation as allocation_lib
from sera_jax import estimators, metrics
from sera_jax import history as history_lib
from sera_jax.methods import Method
from sera_jax.studies.lab import task as task_lib

#: Per-step scalar diagnostics, in the order of the last axis of `Runner(...)['steps']`.
STEP_METRICS = ("cosine", "kappa_mean", "kappa_min", "active_frac", "mixed_frac",
                "reward_mean", "phat_abs_err", "grad_norm", "loss")
#: Evaluated every `eval_every` steps (and at step 0), per split.
EVAL_METRICS = ("pass_at_k", "mean_log_p", "mean_p")


@dataclasses.dataclass(frozen=True)
class Setup:
    """Everything static about a lab run (hashable: one compiled program per setup+method)."""

    num_train: int = 32
    num_test: int = 64
    num_answers: int = 16
    feature_dim: int = 16
    num_skills: int = 4
    max_correct: int = 2
    p_floor: float = 1e-6
    base_logit_scale: float = 1.0
    scorer: str = "linear"
    mlp_width: int = 16
    prompts_per_step: int = 8
    n0: int = 8
    n_min: int = 2
    n_max: int = 64
    num_steps: int = 200
    eval_every: int = 20
    learning_rate: float = 0.05
    b1: float = 0.9
    b2: float = 0.999
    eps: float = 1e-8
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    aggregation: str = "sequence_mean"
    unseen: str = "fill"
    posterior_from_history: bool = True
    history_alpha: float = 0.5
    history_beta: float = 0.5
    history_gamma: float = 0.75
    ks: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)

    def __post_init__(self):
        p, m = self.prompts_per_step, self.num_train
        if p < 1 or m % p:
            raise ValueError(f"num_train={m} must be a positive multiple of prompts_per_step={p} "
                             "(whole epochs, as the maze data preparation ensures)")
        if self.num_steps < 1 or self.eval_every < 1 or self.num_steps % self.eval_every:
            raise ValueError(f"num_steps={self.num_steps} must be a positive multiple of "
                             f"eval_every={self.eval_every}")
        if not 2 <= self.n_min <= self.n0 <= self.n_max:
            raise ValueError(f"need 2 <= n_min <= n0 <= n_max, got n_min={self.n_min}, "
                             f"n0={self.n0}, n_max={self.n_max}")
        if self.aggregation not in estimators.AGGREGATIONS:
            raise ValueError(f"aggregation={self.aggregation!r}; allowed "
                             f"{estimators.AGGREGATIONS}")
        if self.max_correct < 1 or self.max_correct >= self.num_answers:
            raise ValueError(f"max_correct={self.max_correct} must be in [1, num_answers)")

    @property
    def budget(self) -> int:
        return self.prompts_per_step * self.n0

    @property
    def steps_per_epoch(self) -> int:
        return self.num_train // self.prompts_per_step

    @property
    def eval_steps(self) -> np.ndarray:
        """Steps at which pass@k is evaluated: 0, eval_every, 2·eval_every, ..., num_steps."""
        return np.arange(0, self.num_steps + 1, self.eval_every)

    def with_(self, **changes: Any) -> Setup:
        return dataclasses.replace(self, **changes)


def setup_from_config(config: ml_collections.ConfigDict) -> Setup:
    """`Setup` from the `task`, `train` and `history` blocks of a lab config."""
    t, r, h = config.task, config.train, config.history
    return Setup(
        num_train=t.num_train, num_test=t.num_test, num_answers=t.num_answers,
        feature_dim=t.feature_dim, num_skills=t.num_skills, max_correct=t.max_correct,
        p_floor=t.p_floor, base_logit_scale=t.base_logit_scale, scorer=t.scorer,
        mlp_width=t.mlp_width, prompts_per_step=r.prompts_per_step, n0=r.n0, n_min=r.n_min,
        n_max=r.n_max, num_steps=r.num_steps, eval_every=r.eval_every,
        learning_rate=r.learning_rate, b1=r.b1, b2=r.b2, eps=r.eps,
        weight_decay=r.weight_decay, grad_clip=r.grad_clip, aggregation=r.aggregation,
        unseen=r.unseen, posterior_from_history=r.posterior_from_history,
        history_alpha=h.alpha, history_beta=h.beta, history_gamma=h.gamma,
        ks=tuple(int(k) for k in config.report.ks))


def make_optimizer(setup: Setup) -> optax.GradientTransformation:
    """AdamW (constant lr) after global-norm clipping (0 = none), as the RL trainer."""
    adamw = optax.adamw(setup.learning_rate, b1=setup.b1, b2=setup.b2, eps=setup.eps,
                        weight_decay=setup.weight_decay)
    if setup.grad_clip > 0:
        return optax.chain(optax.clip_by_global_norm(setup.grad_clip), adamw)
    return adamw


def seed_keys(seed: int, num_seeds: int) -> Array:
    """The S per-seed keys (raw uint32[S, 2]) shared by every method: seed s is
    `fold_in(key(seed), s)`."""
    base = jax.random.key(seed)
    return jax.vmap(lambda s: jax.random.key_data(jax.random.fold_in(base, s)))(
        jnp.arange(num_seeds))


def _posterior(h: history_lib.SuccessHistory, ids: Array) -> tuple[Array, Array]:
    """The frozen Beta posterior (α + S, β + F) of the batch (the prior for unseen ids)."""
    return h.alpha + h.successes[ids], h.beta + h.failures[ids]


def _takes(allocator: str, option: str) -> bool:
    return option in allocation_lib.ALLOCATOR_OPTIONS.get(allocator, ())


def allocate_step(method: Method, setup: Setup, p_hat: Array, post: tuple[Array, Array],
                  pilot_successes: Array | None = None) -> allocation_lib.Allocation:
    """The method's allocation of one batch (traced): `Method.allocate`, given the pilot's
    successes (two-stage allocators) and the history's posterior (allocators that take
    alpha/beta, when `posterior_from_history`)."""
    alpha, beta = (post if setup.posterior_from_history and _takes(method.allocator, "alpha")
                   else (None, None))
    return method.allocate(p_hat, setup.budget, n_min=setup.n_min, n_max=setup.n_max,
                           unseen=setup.unseen, pilot_successes=pilot_successes, alpha=alpha,
                           beta=beta)


def _task_cfg(setup: Setup) -> tuple[tuple[str, Any], ...]:
    names = ("num_train", "num_test", "num_answers", "feature_dim", "num_skills",
             "max_correct", "p_floor", "base_logit_scale", "scorer", "mlp_width")
    return tuple((n, getattr(setup, n)) for n in names)


def make_tasks(setup: Setup, seed: int, num_seeds: int, law: Any = "maze"
               ) -> tuple[task_lib.LabTask, task_lib.LabTask, Any]:
    """(train, held-out, initial params) of every seed, stacked on a leading axis S.

    Seed s draws from `np.random.default_rng([seed, s])` and the law only, so the task
    instance and the initial policy are the same for every method (pairing). `law`: a name
    of `task.DIFFICULTIES`, (weight, a, b) rows or an array from `task.difficulty_array`.
    """
    law_arr = (task_lib.difficulty_array(law) if isinstance(law, str | tuple | list)
               else np.asarray(law))
    cfg = dict(_task_cfg(setup))
    seeds = []
    for s in range(num_seeds):
        rng = np.random.default_rng([int(seed), s])
        tr, te = task_lib.make_task(rng, law_arr, cfg)
        seeds.append((tr, te, task_lib.init_params(rng, cfg)))
    return jax.tree.map(lambda *xs: jnp.stack(xs), *seeds)


@functools.partial(jax.jit, static_argnames=("ks",))
def _evaluate(params: Any, train: task_lib.LabTask, test: task_lib.LabTask, ks: tuple
              ) -> tuple[Array, Array, Array]:
    """(pass@k [2, len(ks)], mean log p [2], mean p [2]) over (train, held-out), exact."""
    out = []
    for split in (train, test):
        lp = task_lib.log_success_probs(params, split)
        p = jnp.exp(lp)
        out.append((task_lib.analytic_pass_at_k(p, ks), jnp.mean(lp), jnp.mean(p)))
    return tuple(jnp.stack(x) for x in zip(*out))


_evaluate_seeds = jax.jit(jax.vmap(_evaluate, in_axes=(0, 0, 0, None)), static_argnums=3)


class Runner:
    """All S seeds of one method: `runner(keys, tasks) -> dict of NumPy arrays`.

    The compiled program is one block of `eval_every` steps for every seed (vmap over seeds,
    scan over steps, evaluation at the end); it does not depend on `num_steps`, the task
    instance or the difficulty law, so one compilation serves every run of this (method,
    shape). Output fields: `steps` float32[S, T, len(STEP_METRICS)], `counts` int32[S, T, P],
    `pass_at_k` float32[S, E, 2, len(ks)] (split 0 = train, 1 = held-out) at
    `Setup.eval_steps`, `mean_log_p` and `mean_p` float32[S, E, 2].
    """

    def __init__(self, method: Method, setup: Setup):
        self.method, self.setup = method, setup
        self.tx = make_optimizer(setup)
        step = _make_step(method, setup, self.tx)

        def block(carry, raw_key, train, b):
            ts = b * setup.eval_every + jnp.arange(setup.eval_every)
            k_data, k_roll = jax.random.split(jax.random.fold_in(
                jax.random.wrap_key_data(raw_key), 1))
            carry, out = lax.scan(lambda c, t: step(c, t, train, k_data, k_roll), carry, ts)
            return carry, out

        self._block = jax.jit(jax.vmap(block, in_axes=(0, 0, 0, None)))

    def init_carry(self, params0: Any) -> tuple:
        """(params, optimiser state, empty history) of every seed."""
        s = self.setup
        num = jax.tree.leaves(params0)[0].shape[0]
        h = history_lib.SuccessHistory.create(s.num_train, s.history_alpha, s.history_beta,
                                              s.history_gamma)
        h = jax.tree.map(lambda x: jnp.broadcast_to(x, (num,) + x.shape), h)
        return params0, jax.vmap(self.tx.init)(params0), h

    def __call__(self, keys: Array, tasks: tuple, num_steps: int | None = None
                 ) -> dict[str, np.ndarray]:
        s = self.setup
        num_steps = s.num_steps if num_steps is None else num_steps
        if num_steps % s.eval_every:
            raise ValueError(f"num_steps={num_steps} is not a multiple of eval_every="
                             f"{s.eval_every}")
        train, test, params0 = tasks
        carry = self.init_carry(params0)
        evals = [_evaluate_seeds(params0, train, test, s.ks)]
        rows, counts = [], []
        for b in range(num_steps // s.eval_every):
            carry, (r, c) = self._block(carry, keys, train, jnp.int32(b))
            rows.append(r)
            counts.append(c)
            evals.append(_evaluate_seeds(carry[0], train, test, s.ks))
        host = jax.device_get((rows, counts, evals))
        cat = lambda xs: np.concatenate([np.asarray(x) for x in xs], axis=1)
        ev = [np.stack([np.asarray(e[i]) for e in host[2]], axis=1) for i in range(3)]
        return {"steps": cat(host[0]), "counts": cat(host[1]), "pass_at_k": ev[0],
                "mean_log_p": ev[1], "mean_p": ev[2]}


def _make_step(method: Method, setup: Setup, tx: optax.GradientTransformation) -> Callable:
    """One training step of one seed: (carry, t, train task, data key, rollout key) ->
    (carry, (metrics row, counts)); see the module docstring for its seven parts."""
    est = estimators.get_advantage_estimator(method.estimator)
    num_p, n0, budget, n_max = setup.prompts_per_step, setup.n0, setup.budget, setup.n_max
    m, spe = setup.num_train, setup.steps_per_epoch
    pilot = method.pilot_size(setup.n_min)

    def step(carry, t, train, k_data, k_roll):
        params, opt_state, h = carry
        epoch, pos = t // spe, t % spe
        h = lax.cond(pos == 0, history_lib.start_epoch, lambda x: x, h)
        perm = jax.random.permutation(jax.random.fold_in(k_data, epoch), m)
        ids = lax.dynamic_slice_in_dim(perm, pos * num_p, num_p)
        p_hat = history_lib.lookup(h, ids)
        log_pi = task_lib.log_policy(params, train)  # [M, K]
        u = jax.random.uniform(jax.random.fold_in(k_roll, t), (m, n_max))

        def draw(rows_prompt: Array, rows_rank: Array) -> tuple[Array, Array]:
            """(answer, reward) of rollout `rows_rank` of batch prompt `rows_prompt`."""
            x = ids[rows_prompt]
            a = task_lib.sample_answers(log_pi[x], u[x, rows_rank])
            return a, train.correct[x, a].astype(jnp.float32)

        k1 = None
        if pilot:  # successes of the first `pilot` rollouts of each batch prompt
            q = jnp.repeat(jnp.arange(num_p), pilot)
            j = jnp.tile(jnp.arange(pilot), num_p)
            k1 = jnp.sum(draw(q, j)[1].reshape(num_p, pilot), axis=1)
        alloc = allocate_step(method, setup, p_hat, _posterior(h, ids), k1)
        counts = alloc.counts
        pw = method.prompt_weights(counts, alloc.weights)
        seg = estimators.segment_ids_from_counts(counts, budget)
        rank = estimators.ranks_in_segments(counts, seg)
        answers, rewards = draw(seg, rank)
        adv = est(rewards, seg, num_p)
        w = estimators.rollout_weights(pw, seg)
        rows = ids[seg]

        def loss_fn(q):
            lp = task_lib.log_policy(q, train)[rows, answers]
            return estimators.policy_gradient_loss(
                lp[:, None], jnp.ones((budget, 1), bool), adv, w,
                aggregation=setup.aggregation, num_prompts=num_p, n0=n0, max_len=1)

        loss, grads = jax.value_and_grad(loss_fn)(params)
        exact = task_lib.exact_gradient(params, train, ids)
        cos = metrics.cosine(jax.tree.map(jnp.negative, grads), exact)
        updates, opt_state = tx.update(grads, opt_state, params)
        new_params = optax.apply_updates(params, updates)
        h = history_lib.update_from_rollouts(h, ids, seg, rewards)

        p_true = jnp.exp(task_lib.log_success_probs(params, train))[ids]
        active = counts > 0
        n_act = jnp.maximum(jnp.sum(active), 1)
        # κ(p, N_q); for a two-stage method E[scale | pilot] (sera_jax.allocation.beyond).
        kap = method.expected_scale(p_true, counts, n_min=setup.n_min, pilot_successes=k1)
        succ = jax.ops.segment_sum(rewards, seg, num_p)
        mixed = active & (succ > 0) & (succ < counts)
        seen = ~jnp.isnan(p_hat)
        err = jnp.sum(jnp.where(seen, jnp.abs(jnp.nan_to_num(p_hat) - p_true), 0.0))
        row = jnp.stack([
            cos,
            jnp.sum(jnp.where(active, kap, 0.0)) / n_act,
            jnp.min(jnp.where(active, kap, jnp.inf)),
            jnp.mean(active.astype(jnp.float32)),
            jnp.sum(mixed) / n_act,
            jnp.mean(rewards),
            jnp.where(jnp.any(seen), err / jnp.maximum(jnp.sum(seen), 1), jnp.nan),
            optax.global_norm(grads),
            loss,
        ]).astype(jnp.float32)
        return (new_params, opt_state, h), (row, counts)

    return step


def run_method(method: Method, setup: Setup, seed: int, num_seeds: int, law: Any = "maze"
               ) -> dict[str, np.ndarray]:
    """`Runner(method, setup)` on seeds 0..num_seeds−1 of `seed` (tasks, keys paired)."""
    return Runner(method, setup)(seed_keys(seed, num_seeds),
                                 make_tasks(setup, seed, num_seeds, law))
