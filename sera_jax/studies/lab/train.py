"""The lab's training run: every seed of one method as ONE compiled program (vmap over seeds).

One step of one seed, with the library's pieces unchanged (the same order as the RL trainer,
`sera_jax.rl.trainer`):

1. at an epoch start (every M/P steps) `history.start_epoch` folds the pending outcomes in
   and freezes p̂; the batch is the next P prompt ids of the epoch's permutation;
2. p̂ = `history.lookup` (NaN = unseen);
3. the rollout plan (`sera_jax.objective.plan_rollouts`, the trainer's, traced inside the
   vmap): the method's allocator (`Method.allocate`) spends B = P·N0 rollouts, per-prompt
   loss weights `Method.prompt_weights`, segment ids and ranks; a two-stage allocator
   (`sera_jax.allocation.beyond.TWO_STAGE`) first draws its pilot -- rollouts 0..m−1 of
   every batch prompt -- and gets their successes; allocators with Beta-posterior options
   (alpha, beta) get the history's frozen posterior (α + S, β + F) when
   `posterior_from_history`;
4. rollouts: row r of the flat batch is rollout `ranks[r]` of its prompt x and draws its
   answer (the maze family: its H moves) by inverse CDF from the uniforms U_t[x, j]; the
   null control shuffles the B rewards (`batch_gradient`);
5. the loss `objective.surrogate_loss` (the method's advantage estimator, per-rollout
   weights, the aggregation), then the update of the `rl.optimizer` block
   (`sera_jax.optim`: AdamW after global-norm clipping by default);
6. `history.update_from_rollouts` (pending until the next epoch).

A stateful method (`Method.stateful`: `gdro`, a controller across steps) carries its
allocator's state in the scan carry, `(params, opt_state, history, allocator state)`: the
fresh `Method.init_state()` per seed, then each step's `RolloutPlan.state`. Stateless
methods keep the three-part carry (their programs are unchanged).

A method with DAPO dynamic sampling (`Method.dynamic_sampling`: `dapo`, `sera_dapo`) runs
`lab.dynamic.make_step` instead: up to `Setup.max_rounds` rounds of P prompts per step, the
informative groups packed into the B rows, every generated rollout counted (`generated`).

Pairing: for a seed, the task instance, the initial policy, the data order and the uniforms
U_t[x, j] depend on the seed only, never on the method; so two methods that give prompt x the
same N at step t with the same policy draw the same answers. The A/A arm (`Runner(...)(stream=1)`)
changes only the rollout key, hence the uniforms.

Exact diagnostics per step (the policy is small, so everything is exact): the cosine of the
step's policy gradient to the exact ∇ mean_batch log p, the realised κ(p_q, N_q) over active
prompts (exact p), |p̂ − p|; every `eval_every` steps analytic pass@k on the train and the
held-out prompts.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax import Array, lax

from sera_jax import checks, metrics, objective, optim
from sera_jax import history as history_lib
from sera_jax.methods import Method
from sera_jax.studies.lab import dynamic
from sera_jax.studies.lab import task as task_lib
from sera_jax.studies.lab.shared import (
    FAMILIES,
    Setup,
    epoch_batch,
    history_posterior,
    rollout_plan,
    rollout_uniforms,
    setup_from_config,
)

#: With the names re-exported from `shared` (defined there so that `dynamic` builds on them
#: without importing this module).
__all__ = ["AA_TAG", "EVAL_METRICS", "FAMILIES", "NULL_TAG", "STEP_METRICS", "Runner",
           "Setup", "batch_gradient", "check_first_step", "epoch_batch", "exact_gradient",
           "initial_carry", "make_tasks", "rollout_stream", "rollout_uniforms", "seed_keys",
           "setup_from_config"]

#: Control arms run beside every comparison, both on the uniform runner itself: the null
#: (`Runner(null_arm=True)(null=True)`: the rewards of each batch shuffled, `shuffle_key`)
#: and the A/A arm (`Runner.__call__(stream=1)`: another rollout stream).
#: fold_in tags: the null arm's shuffle key of step t is fold_in(fold_in(k_roll, t), NULL_TAG);
#: the A/A arm's rollout key is fold_in(k_roll, AA_TAG) (steps never reach these values).
NULL_TAG, AA_TAG = 1_000_003, 1_000_033

#: Per-step scalar diagnostics, in the order of the last axis of `Runner(...)['steps']`.
#: `generated`: rollouts generated in the step (B, or rounds × B with dynamic sampling).
STEP_METRICS = ("cosine", "kappa_mean", "kappa_min", "active_frac", "mixed_frac",
                "reward_mean", "phat_abs_err", "grad_norm", "loss", "generated")
#: Evaluated every `eval_every` steps (and at step 0), per split.
EVAL_METRICS = ("pass_at_k", "mean_log_p", "mean_p")


def seed_keys(seed: int, seeds: Sequence[int]) -> Array:
    """The per-seed keys (raw uint32[S, 2]) shared by every method: seed s of `seeds` is
    `fold_in(key(seed), s)`."""
    base = jax.random.key(seed)
    return jax.vmap(lambda s: jax.random.key_data(jax.random.fold_in(base, s)))(
        jnp.asarray(seeds, jnp.int32))


def _task_cfg(setup: Setup) -> tuple[tuple[str, Any], ...]:
    names = ("num_train", "num_test", "num_answers", "feature_dim", "num_skills",
             "max_correct", "p_floor", "base_logit_scale", "scorer", "mlp_width",
             "maze_size", "maze_openings", "horizon", "min_path", "init_blocked")
    return tuple((n, getattr(setup, n)) for n in names)


def make_tasks(setup: Setup, seed: int, seeds: Sequence[int], law: Any = "maze"
               ) -> tuple[task_lib.LabTask, task_lib.LabTask, Any]:
    """(train, held-out, initial params) of every seed of `seeds`, stacked on a leading axis.

    Seed s draws from `np.random.default_rng([seed, s])` and the law only, so the task
    instance and the initial policy are the same for every method (pairing). `law`: a name
    of `task.DIFFICULTIES`, (weight, a, b) rows or an array from `task.difficulty_array`.
    """
    law_arr = (task_lib.difficulty_array(law) if isinstance(law, str | tuple | list)
               else np.asarray(law))
    cfg = dict(_task_cfg(setup))
    fam = FAMILIES[setup.family]
    per_seed = []
    for s in seeds:
        rng = np.random.default_rng([int(seed), int(s)])
        tr, te = fam.make_task(rng, law_arr, cfg)
        per_seed.append((tr, te, fam.init_params(rng, cfg)))
    return jax.tree.map(lambda *xs: jnp.stack(xs), *per_seed)


@functools.partial(jax.jit, static_argnames=("ks", "family"))
def _evaluate(params: Any, train: Any, test: Any, ks: tuple, family: str = "answers"
              ) -> tuple[Array, Array, Array]:
    """(pass@k [2, len(ks)], mean log p [2], mean p [2]) over (train, held-out), exact."""
    out = []
    for split in (train, test):
        lp = FAMILIES[family].log_success_probs(params, split)
        p = jnp.exp(lp)
        out.append((task_lib.analytic_pass_at_k(p, ks), jnp.mean(lp), jnp.mean(p)))
    return tuple(jnp.stack(x) for x in zip(*out))


_evaluate_seeds = jax.jit(jax.vmap(_evaluate, in_axes=(0, 0, 0, None, None)),
                          static_argnums=(3, 4))


class Runner:
    """All S seeds of one method: `runner(keys, tasks) -> dict of NumPy arrays`.

    The compiled program is one block of `eval_every` steps for every seed (vmap over seeds,
    scan over steps, evaluation at the end); it does not depend on `num_steps`, the task
    instance, the difficulty law or the rollout stream, so one compilation serves every run
    of this (method, shape, control). Output fields: `steps` float32[S, T, len(STEP_METRICS)],
    `counts` int32[S, T, P], `pass_at_k` float32[S, E, 2, len(ks)] (split 0 = train,
    1 = held-out) at `Setup.eval_steps`, `mean_log_p` and `mean_p` float32[S, E, 2].

    `null_arm=True`: the runner can also run the null control (`__call__(null=True)`): the
    rewards of every batch are shuffled across its B rows before the loss and the history
    see them (a permutation drawn from the step key): same lr, budget and rollouts, no
    reward-answer association. `multiplicity_switch=True`: the runner also runs the method's
    multiplicity ablation (`__call__(multiplicity=False)`: w_q = 1{N_q > 0} instead of the
    allocator's N0/N_q; `Method.prompt_weights`). Both switches are traced, so a method, its
    A/A arm, its null arm and its ablation share ONE compiled program (the selects leave the
    other arm's values bit-identical to a runner without the switch).
    """

    def __init__(self, method: Method, setup: Setup, null_arm: bool = False,
                 multiplicity_switch: bool = False):
        if multiplicity_switch and method.dynamic_sampling:
            raise ValueError("multiplicity_switch: not for a dynamic-sampling method")
        self.method, self.setup = method, setup
        self.null_arm, self.multiplicity_switch = bool(null_arm), bool(multiplicity_switch)
        self.tx = optim.make_optimizer(dict(setup.optimizer))
        step = _make_step(method, setup, self.tx, shuffle=self.null_arm,
                          weight_switch=self.multiplicity_switch)

        def block(carry, raw_key, train, b, stream, null, multiplicity):
            ts = b * setup.eval_every + jnp.arange(setup.eval_every)
            k_data, k_roll = jax.random.split(jax.random.fold_in(
                jax.random.wrap_key_data(raw_key), 1))
            k_roll = rollout_stream(k_roll, stream)
            carry, out = lax.scan(
                lambda c, t: step(c, t, train, k_data, k_roll, null, multiplicity), carry, ts)
            return carry, out

        self._block = jax.jit(jax.vmap(block, in_axes=(0, 0, 0, None, None, None, None)))

    def init_carry(self, params0: Any) -> tuple:
        """(params, optimiser state, empty history[, fresh allocator state]) of every seed
        (the allocator state for a stateful method only: `initial_carry`)."""
        num = jax.tree.leaves(params0)[0].shape[0]
        one = initial_carry(self.method, self.setup, self.tx, None)[2:]
        rest = jax.tree.map(lambda x: jnp.broadcast_to(x, (num,) + x.shape), one)
        return (params0, jax.vmap(self.tx.init)(params0), *rest)

    def __call__(self, keys: Array, tasks: tuple, num_steps: int | None = None,
                 stream: int = 0, null: bool = False, multiplicity: bool | None = None
                 ) -> dict[str, np.ndarray]:
        """Run every seed; `stream` 1 = the A/A rollout stream (`rollout_stream`): the same
        task, initial policy and data order, other rollout uniforms; `null`: the null
        control (rewards shuffled within each batch; needs `null_arm=True`);
        `multiplicity`: the weights' multiplicity correction (None: the method's; the other
        value needs `multiplicity_switch=True`)."""
        s = self.setup
        num_steps = s.num_steps if num_steps is None else num_steps
        if num_steps % s.eval_every:
            raise ValueError(f"num_steps={num_steps} is not a multiple of eval_every="
                             f"{s.eval_every}")
        if stream not in (0, 1):
            raise ValueError(f"stream={stream!r}; allowed 0 (the paired stream) or 1 (A/A)")
        if null and not self.null_arm:
            raise ValueError("null=True needs a runner built with null_arm=True (the "
                             "shuffle is compiled into the program)")
        multiplicity = self.method.multiplicity if multiplicity is None else bool(multiplicity)
        if multiplicity != self.method.multiplicity and not self.multiplicity_switch:
            raise ValueError(f"multiplicity={multiplicity} needs a runner built with "
                             "multiplicity_switch=True (the weights are compiled in)")
        train, test, params0 = tasks
        carry = self.init_carry(params0)
        evals = [_evaluate_seeds(params0, train, test, s.ks, s.family)]
        rows, counts = [], []
        for b in range(num_steps // s.eval_every):
            carry, (r, c) = self._block(carry, keys, train, jnp.int32(b), jnp.int32(stream),
                                         jnp.bool_(null), jnp.bool_(multiplicity))
            rows.append(r)
            counts.append(c)
            evals.append(_evaluate_seeds(carry[0], train, test, s.ks, s.family))
        host = jax.device_get((rows, counts, evals))
        cat = lambda xs: np.concatenate([np.asarray(x) for x in xs], axis=1)
        ev = [np.stack([np.asarray(e[i]) for e in host[2]], axis=1) for i in range(3)]
        return {"steps": cat(host[0]), "counts": cat(host[1]), "pass_at_k": ev[0],
                "mean_log_p": ev[1], "mean_p": ev[2]}


def initial_carry(method: Method, setup: Setup, tx: optax.GradientTransformation,
                  params0: Any) -> tuple:
    """One seed's initial carry: (params0, tx.init(params0), empty history), plus the
    method's fresh allocator state when it is stateful (`Method.init_state`). With
    ``params0`` None the optimiser state is None too (only the history part is wanted)."""
    s = setup
    h = history_lib.SuccessHistory.create(s.num_train, s.history_alpha, s.history_beta,
                                          s.history_gamma)
    opt = None if params0 is None else tx.init(params0)
    return (params0, opt, h) + ((method.init_state(),) if method.stateful else ())


def check_first_step(method: Method, setup: Setup, keys: Array, tasks: tuple) -> None:
    """Checked mode on the first step: step 0 of every seed of `method`, with
    `sera_jax.checks`' value checks on what the step handed the library and got back: the
    prompt ids, p̂ from `history.lookup` (in [0, 1] or NaN), the plan's segment ids, the
    rewards (binary), the budget spent exactly, a finite loss and gradient. The step runs
    compiled and returns those values; the checks run on them eagerly (checkify does not
    transform the vmapped step's loops). Raises `checks.CheckError` (a ValueError) naming
    the seed and the first bad value. A dynamic-sampling method is not checked (its step is
    `lab.dynamic`'s). One extra compilation, so a study checks a few methods only."""
    if method.dynamic_sampling:
        return
    tx = optim.make_optimizer(dict(setup.optimizer))
    step = _make_step(method, setup, tx, checked=True)
    s = setup

    def first(params0, raw_key, train):
        k_data, k_roll = jax.random.split(jax.random.fold_in(
            jax.random.wrap_key_data(raw_key), 1))
        _, (_, counts, probe) = step(initial_carry(method, setup, tx, params0), jnp.int32(0),
                                     train, k_data, k_roll)
        return counts, probe

    train, _, params0 = tasks
    counts, probe = jax.device_get(jax.jit(jax.vmap(first))(params0, keys, train))
    for i in range(counts.shape[0]):
        where = f"lab step 0 of {method.name}, seed {i}"
        checks.check_ids("prompt_ids", probe["ids"][i], s.num_train, where)
        checks.check_probabilities(probe["p_hat"][i], where + ": history.lookup")
        checks.check_ids("segment_ids", probe["segment_ids"][i], s.prompts_per_step, where)
        checks.check_rewards(probe["rewards"][i], True, where)
        if int(counts[i].sum()) != s.budget:
            raise checks.CheckError(f"{where}: the allocation spent {int(counts[i].sum())} "
                                    f"rollouts, not the budget B = {s.budget}")
        if not (np.isfinite(probe["loss"][i]) and np.isfinite(probe["grad_norm"][i])):
            raise checks.CheckError(f"{where}: the loss or the gradient is not finite")


def rollout_stream(k_roll: Array, stream: Array) -> Array:
    """The rollout key of stream 0 (k_roll itself: every method's paired stream) or 1 (the
    A/A arm: fold_in(k_roll, AA_TAG)); `stream` may be traced (one compiled program)."""
    other = jax.random.key_data(jax.random.fold_in(k_roll, AA_TAG))
    return jax.random.wrap_key_data(jnp.where(stream > 0, other, jax.random.key_data(k_roll)))


def batch_gradient(method: Method, setup: Setup, params: Any, train: Any, ids: Array,
                   p_hat: Array, post: tuple[Array, Array], u: Array,
                   shuffle_key: Array | None = None, shuffle: Array | bool = True,
                   multiplicity: Array | None = None, alloc_state: Any = None
                   ) -> tuple[Any, Array, dict[str, Any]]:
    """One batch's (∇ surrogate loss, loss, aux): steps 3-5 of the module docstring.

    The plan (`rollout_plan`, after the pilot of a two-stage method), rollout row r = rollout
    `ranks[r]` of batch prompt `segment_ids[r]` drawn from u[ids[seg], rank], its reward,
    then the gradient of `objective.surrogate_loss` at `params`; minus it is the step's
    policy gradient, whose expectation over u is (1/P) Σ_q (w_q N_q/N0) κ̄_q ∇log p_q
    (SERA_SPEC). `shuffle_key`: the null arm's permutation of the B rewards (the batch's
    rewards are kept, their assignment to rollouts is lost), applied where `shuffle` (a
    traced switch: one program for the arm and its null) is true. `multiplicity` (traced, or
    None: the method's): false replaces the plan's weights by 1{N_q > 0}, the ablation's
    (`Method.prompt_weights`), so a method and its ablation are one program. `alloc_state`: a
    stateful method's allocator state (None: a fresh one); its next state is
    `aux["plan"].state`. aux: plan, rewards, k1 (the pilot's successes or None). Pure:
    jit/vmap-able (tests vmap it over many u).
    """
    fam = FAMILIES[setup.family]
    num_p = setup.prompts_per_step
    pilot = method.pilot_size(setup.n_min)
    log_pi = fam.log_policy(params, train)

    def draw(rows_prompt: Array, rows_rank: Array) -> tuple[Any, Array]:
        """(actions, rewards) of rollout `rows_rank` of batch prompt `rows_prompt`."""
        x = ids[rows_prompt]
        return fam.sample(log_pi, train, x, u[x, rows_rank])

    k1 = None
    if pilot:  # successes of the first `pilot` rollouts of each batch prompt
        q = jnp.repeat(jnp.arange(num_p), pilot)
        j = jnp.tile(jnp.arange(pilot), num_p)
        k1 = jnp.sum(draw(q, j)[1].reshape(num_p, pilot), axis=1)
    plan = rollout_plan(method, setup, p_hat, post, k1, alloc_state)
    if multiplicity is not None:
        plan = plan._replace(prompt_weights=jnp.where(
            multiplicity, plan.prompt_weights, (plan.counts > 0).astype(jnp.float32)))
    actions, rewards = draw(plan.segment_ids, plan.ranks)
    if shuffle_key is not None:
        shuffled = rewards[jax.random.permutation(shuffle_key, rewards.shape[0])]
        rewards = shuffled if shuffle is True else jnp.where(shuffle, shuffled, rewards)
    rows = ids[plan.segment_ids]
    max_len = setup.horizon if setup.family == "maze" else None

    def loss_fn(q):
        lp, mask = fam.rollout_logprobs(q, train, rows, actions)
        return objective.surrogate_loss(lp, rewards, plan, estimator=method.estimator,
                                        aggregation=setup.aggregation, n0=setup.n0,
                                        mask=mask, max_len=max_len)

    loss, grads = jax.value_and_grad(loss_fn)(params)
    return grads, loss, {"plan": plan, "rewards": rewards, "k1": k1}


def exact_gradient(family: str, params: Any, task: Any, ids: Array | None = None) -> Any:
    """∇_θ mean_{x ∈ ids} log p_θ(x) (all prompts when ids is None), exact: autodiff of the
    family's closed form (answers) or DP (maze); the target of every MaxRL estimator."""
    def mean_log_p(q):
        lp = FAMILIES[family].log_success_probs(q, task)
        return jnp.mean(lp if ids is None else lp[ids])

    return jax.grad(mean_log_p)(params)


def _make_step(method: Method, setup: Setup, tx: optax.GradientTransformation,
               shuffle: bool = False, checked: bool = False, weight_switch: bool = False
               ) -> Callable:
    """One training step of one seed: (carry, t, train task, data key, rollout key) ->
    (carry, (metrics row, counts)); see the module docstring for its six parts. `shuffle`:
    the step takes a traced `null` switch (the null arm: `batch_gradient`'s shuffle_key from
    the step key) as its sixth argument; `weight_switch`: a traced `multiplicity` switch as
    its seventh (`batch_gradient`); without them those arguments are ignored. `checked`: add the
    checked-mode value checks (`sera_jax.checks`, for `checks.jit_checked`) on what the step
    hands the library and gets back (`check_first_step`). A dynamic-sampling method gets
    `lab.dynamic.make_step` (same signature, unchecked)."""
    if method.dynamic_sampling:
        return dynamic.make_step(method, setup, tx, shuffle)
    num_p = setup.prompts_per_step
    fam = FAMILIES[setup.family]
    stateful = method.stateful

    def step(carry, t, train, k_data, k_roll, null=False, multiplicity=True):
        if stateful != (len(carry) == 4):
            raise ValueError(f"method {method.name!r}: the carry must be (params, opt_state, "
                             "history" + (", allocator state)" if stateful else ")")
                             + f", got {len(carry)} parts (`initial_carry`)")
        params, opt_state, h = carry[:3]
        alloc_state = carry[3] if stateful else None
        h, ids = epoch_batch(setup, h, t, k_data)
        p_hat = history_lib.lookup(h, ids)
        u = rollout_uniforms(setup, k_roll, t)
        shuffle_key = (jax.random.fold_in(jax.random.fold_in(k_roll, t), NULL_TAG)
                       if shuffle else None)
        grads, loss, aux = batch_gradient(method, setup, params, train, ids, p_hat,
                                          history_posterior(h, ids), u, shuffle_key, null,
                                          multiplicity if weight_switch else None, alloc_state)
        plan, rewards, k1 = aux["plan"], aux["rewards"], aux["k1"]
        counts, seg = plan.counts, plan.segment_ids
        exact = exact_gradient(setup.family, params, train, ids)
        cos = metrics.cosine(jax.tree.map(jnp.negative, grads), exact)
        updates, opt_state = tx.update(grads, opt_state, params)
        new_params = optax.apply_updates(params, updates)
        h = history_lib.update_from_rollouts(h, ids, seg, rewards)

        p_true = jnp.exp(fam.log_success_probs(params, train))[ids]
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
            setup.budget,
        ]).astype(jnp.float32)
        carry = (new_params, opt_state, h) + ((plan.state,) if stateful else ())
        if checked:  # the values `check_first_step` checks on the host
            return carry, (row, counts, dict(
                ids=ids, p_hat=p_hat, segment_ids=seg, rewards=rewards, loss=loss,
                grad_norm=optax.global_norm(grads)))
        return carry, (row, counts)

    return step
