"""DAPO dynamic sampling in the lab: a static-shape JAX emulation of `sera_jax.dynamic_sampling`.

The lab runs every seed of a method as one jitted, vmapped program (`train.Runner`), so the
host loop of `dynamic_sampling.fill` (draw rounds until the batch is full) becomes a fixed
number R = `Setup.max_rounds` of rounds, all drawn inside the step, of which only the first
`Packing.rounds` count as generated. One step of one seed (`make_step`):

1. as in `train._make_step`: the epoch's history and the step's batch of P prompts (round 0),
   `shared.epoch_batch`;
2. rounds 1..R−1 are P further train prompts each, a draw without replacement of the M train
   prompts keyed by fold_in(fold_in(fold_in(k_data, REFILL_TAG), t), i) -- a function of the
   seed and step only, so `dapo` and `sera_dapo` refill with the same prompts and uniforms
   (pairing). They do not advance the epoch's data order (the tunix learner's refills consume
   the next batches instead): round 0 stays the step's batch of every other method;
3. each round is allocated by the method's allocator (B = P·N0 rollouts, p̂ from the history
   frozen at the epoch start, a pilot first for a two-stage allocator) and drawn with the
   policy at this step: round 0 from the step's uniforms U_t[x, j] (`shared.rollout_uniforms`,
   so round 0 is exactly what the method's allocator alone would draw), round i >= 1 from
   uniforms keyed by fold_in(fold_in(k_roll, t), REFILL_TAG + i), indexed by position in the
   round; advantages and weights w_q per round (as the tunix learner computes them);
4. `pack`: the informative groups (0 < K_q < N_q) packed first-fit in draw order into B rows,
   stopping after the first round at which fewer than `min_group` rows are left (that is
   `dynamic_sampling.fill`'s stopping rule; a group of a later round is at least `min_group`
   rows, so it could not fit anyway, and the emulation equals `select` on the drawn rounds
   exactly: tests/studies/lab/test_dynamic.py); padding rows have weight 0 and no tokens;
5. the loss of the packed rows (`estimators.policy_gradient_loss`, normaliser P·N0 as for
   every method), the optimiser update;
6. the history gets every drawn round's outcomes (they were generated), none of the rest.

Per-step metrics (`train.STEP_METRICS`) of a dynamic-sampling step: `cosine` vs the exact
∇ mean log p over the kept groups' prompts (the batch the loss sees), `kappa_*` over the kept
groups, `active_frac` = kept rows / B, `mixed_frac` = informative / non-empty groups of the
drawn rounds (the filter's yield), `reward_mean` and `phat_abs_err` over the drawn rounds,
`generated` = rounds drawn × B. The `counts` output is round 0's allocation.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax
from jax import Array, lax

from sera_jax import estimators, metrics, objective
from sera_jax import history as history_lib
from sera_jax.dynamic_sampling import MIN_INFORMATIVE_GROUP
from sera_jax.methods import Method
from sera_jax.studies.lab import shared

#: fold_in tag of the refill rounds: prompts from fold_in(k_data, REFILL_TAG), uniforms of
#: round i from fold_in(fold_in(k_roll, t), REFILL_TAG + i) (apart from `train.NULL_TAG`
#: and from every epoch and step index).
REFILL_TAG = 2_000_003


class Packing(NamedTuple):
    """`dynamic_sampling.Selection` as arrays (R rounds of N rows, G = num_groups per round).

    rows[b]: index into the rounds' rows concatenated in draw order (round i row r is
    i·N + r); keep[b] False marks a padding row; group[b]: the kept group of row b numbered in
    draw order (padding rows repeat the last kept group, or 0 with none kept) -- as
    `Selection`'s fields. taken, informative [R, G] per group; drawn [R]: the round counts
    as generated.
    """

    rows: Array  # int32 [batch_rows]
    keep: Array  # bool [batch_rows]
    group: Array  # int32 [batch_rows]
    taken: Array  # bool [R, G]
    informative: Array  # bool [R, G]
    drawn: Array  # bool [R]
    num_kept: Array  # int32 []
    num_dropped: Array  # int32 []: groups of drawn rounds left out (all-equal, or no room)
    rounds: Array  # int32 []: rounds drawn (`fill`'s)
    generated: Array  # int32 []: rollouts of the drawn rounds


def min_group(method: Method, n0: int, n_min: int) -> int:
    """The smallest group a round of `method` can hold, `Selection.filled`'s `min_group`: N0
    for the uniform allocator, else max(n_min, 2) (the tunix learner's rule)."""
    return n0 if method.allocator == "uniform" else max(n_min, MIN_INFORMATIVE_GROUP)


def _ranks(segment_ids: Array, counts: Array) -> Array:
    """Index of each row within its group in order of appearance (any layout of segment_ids)."""
    order = jnp.argsort(segment_ids, stable=True)
    first = (jnp.cumsum(counts) - counts)[segment_ids[order]]
    return jnp.zeros_like(segment_ids).at[order].set(
        jnp.arange(segment_ids.shape[0], dtype=segment_ids.dtype) - first)


def pack(segment_ids: Array, rewards: Array, num_groups: int, batch_rows: int,
         min_group: int = MIN_INFORMATIVE_GROUP) -> Packing:
    """`dynamic_sampling.fill` with `select`, traced: R rounds given up front, drawn in order.

    segment_ids int [R, N] (group of each row of each round, in [0, num_groups)), rewards
    float [R, N]; `num_groups`, `batch_rows`, `min_group` static. Rounds are "drawn" while the
    selection is not `filled(min_group)` (round 0 always), as `fill` with max_rounds = R; the
    informative groups (rewards not all equal) of the drawn rounds are packed first-fit in draw
    order (a group kept whole or not at all; one larger than the room left is skipped). Equals
    `select(rounds[:rounds], batch_rows)` field by field. jit/vmap-able.
    """
    num_r, n = segment_ids.shape
    seg = segment_ids.astype(jnp.int32)
    counts = jax.vmap(lambda s: jax.ops.segment_sum(jnp.ones_like(s), s, num_groups))(seg)
    hi = jax.vmap(lambda r, s: jax.ops.segment_max(r, s, num_groups))(rewards, seg)
    lo = jax.vmap(lambda r, s: jax.ops.segment_min(r, s, num_groups))(rewards, seg)
    informative = hi > lo  # empty groups: max = −inf < min = +inf, not informative
    threshold = max(int(min_group), 1)

    def visit(carry, x):
        room, kept, dropped, rounds, done = carry
        c, good, last = x
        live = ~done  # this group's round is drawn
        take = live & good & (c <= room)
        out = (take, batch_rows - room, kept)
        room = room - jnp.where(take, c, 0)
        kept = kept + take
        dropped = dropped + (live & (c > 0) & ~take)
        # The round ends: it counted as drawn; `fill` stops once the batch is filled.
        rounds = rounds + (live & last)
        done = done | (live & last & (room < threshold))
        return (room, kept, dropped, rounds, done), out

    zero = jnp.int32(0)
    last = jnp.tile(jnp.arange(num_groups) == num_groups - 1, num_r)
    (room, kept, dropped, rounds, _), (taken, start, number) = lax.scan(
        visit, (jnp.int32(batch_rows), zero, zero, zero, jnp.bool_(False)),
        (counts.reshape(-1), informative.reshape(-1), last))
    g = (jnp.arange(num_r)[:, None] * num_groups + seg).reshape(-1)  # flat group of each row
    rank = jax.vmap(_ranks)(seg, counts).reshape(-1)
    dest = jnp.where(taken[g], start[g] + rank, batch_rows)  # batch_rows: out of range, dropped
    rows = jnp.zeros(batch_rows, jnp.int32).at[dest].set(jnp.arange(num_r * n, dtype=jnp.int32),
                                                         mode="drop")
    group = jnp.zeros(batch_rows, jnp.int32).at[dest].set(number[g], mode="drop")
    used = batch_rows - room  # kept groups fill rows 0..used−1
    keep = jnp.arange(batch_rows) < used
    rows = jnp.where(keep, rows, rows[jnp.maximum(used - 1, 0)])
    group = jnp.where(keep, group, jnp.maximum(kept - 1, 0))
    return Packing(rows, keep, group, taken.reshape(num_r, num_groups), informative,
                   jnp.arange(num_r) < rounds, kept, dropped, rounds, rounds * n)


def refill_ids(setup: shared.Setup, k_data: Array, t: Array) -> Array:
    """int [max_rounds − 1, P]: the prompts of refill rounds 1..R−1 at step t, each a draw of
    P distinct train prompts keyed by fold_in(fold_in(fold_in(k_data, REFILL_TAG), t), i)."""
    base = jax.random.fold_in(jax.random.fold_in(k_data, REFILL_TAG), t)
    draw = lambda i: jax.random.permutation(jax.random.fold_in(base, i),
                                            setup.num_train)[: setup.prompts_per_step]
    return jax.vmap(draw)(jnp.arange(1, setup.max_rounds))


def round_uniforms(setup: shared.Setup, k_roll: Array, t: Array, ids0: Array) -> Array:
    """[max_rounds, P, n_max, *uniform_shape]: round 0's are the step's U_t[ids0] (the
    uniforms every method draws from); round i's are keyed by fold_in(fold_in(k_roll, t),
    REFILL_TAG + i) and indexed by position in the round."""
    u0 = shared.rollout_uniforms(setup, k_roll, t)[ids0]
    kt = jax.random.fold_in(k_roll, t)
    more = jax.vmap(lambda i: jax.random.uniform(jax.random.fold_in(kt, REFILL_TAG + i),
                                                 u0.shape))(jnp.arange(1, setup.max_rounds))
    return jnp.concatenate([u0[None], more])


def make_step(method: Method, setup: shared.Setup, tx: optax.GradientTransformation,
              shuffle: bool = False) -> Callable:
    """One dynamic-sampling training step of one seed, the signature of `train._make_step`:
    (carry, t, train task, data key, rollout key[, null, multiplicity]) -> (carry, (metrics
    row, round-0 counts)); the six parts of the module docstring. No null arm (`shuffle`
    raises; the switches are ignored): the controls are uniform's."""
    if not method.dynamic_sampling:
        raise ValueError(f"method {method.name!r} does not use dynamic sampling")
    if shuffle:
        raise ValueError("the null control shuffles uniform's rewards; a dynamic-sampling "
                         "method has no null arm")
    num_p, budget, num_r = setup.prompts_per_step, setup.budget, setup.max_rounds
    fam = shared.FAMILIES[setup.family]
    pilot = method.pilot_size(setup.n_min)
    smallest = min_group(method, setup.n0, setup.n_min)
    max_len = setup.horizon if setup.family == "maze" else 1
    flat = lambda x: x.reshape((num_r * budget,) + x.shape[2:])

    def step(carry, t, train, k_data, k_roll, null=False, multiplicity=True):
        del null, multiplicity
        params, opt_state, h = carry
        h, ids0 = shared.epoch_batch(setup, h, t, k_data)
        ids = jnp.concatenate([ids0[None], refill_ids(setup, k_data, t)])  # [R, P]
        p_hat = history_lib.lookup(h, ids.reshape(-1)).reshape(num_r, num_p)
        log_pi = fam.log_policy(params, train)

        def one_round(ids_i, p_hat_i, u_i):
            """Allocate, draw and score one round (step 3 of the module docstring)."""
            def draw(q, j):
                return fam.sample(log_pi, train, ids_i[q], u_i[q, j])

            k1 = None
            if pilot:  # a two-stage allocator's pilot: rollouts 0..pilot−1 of every prompt
                q = jnp.repeat(jnp.arange(num_p), pilot)
                j = jnp.tile(jnp.arange(pilot), num_p)
                k1 = jnp.sum(draw(q, j)[1].reshape(num_p, pilot), axis=1)
            post = shared.history_posterior(h, ids_i)
            plan = shared.rollout_plan(method, setup, p_hat_i, post, k1)
            actions, rewards = draw(plan.segment_ids, plan.ranks)
            adv, w = objective.rollout_coefficients(rewards, plan, method.estimator)
            return plan, actions, rewards, adv, w, k1

        u = round_uniforms(setup, k_roll, t, ids0)
        plan, actions, rewards, adv, w, k1 = jax.vmap(one_round)(ids, p_hat, u)
        pk = pack(plan.segment_ids, rewards, num_p, budget, smallest)
        rows_x = flat(jnp.take_along_axis(ids, plan.segment_ids, axis=1))[pk.rows]
        act = jax.tree.map(lambda a: flat(a)[pk.rows], actions)
        adv_b, w_b = flat(adv)[pk.rows], jnp.where(pk.keep, flat(w)[pk.rows], 0.0)

        def loss_fn(q):
            lp, mask = fam.rollout_logprobs(q, train, rows_x, act)
            if lp.ndim == 1:  # one token per rollout
                lp, mask = lp[:, None], jnp.ones((budget, 1), bool)
            # Padding rows have no tokens (nor weight): out of token_mean's normaliser too.
            return estimators.policy_gradient_loss(
                lp, mask & pk.keep[:, None], adv_b, w_b, aggregation=setup.aggregation,
                num_prompts=num_p, n0=setup.n0, max_len=max_len)

        loss, grads = jax.value_and_grad(loss_fn)(params)
        kept = pk.taken.reshape(-1)
        n_kept = jnp.maximum(jnp.sum(kept), 1)

        def kept_log_p(q):
            lp = fam.log_success_probs(q, train)[ids.reshape(-1)]
            return jnp.sum(jnp.where(kept, lp, 0.0)) / n_kept

        cos = metrics.cosine(jax.tree.map(jnp.negative, grads), jax.grad(kept_log_p)(params))
        updates, opt_state = tx.update(grads, opt_state, params)
        new_params = optax.apply_updates(params, updates)
        drawn = pk.drawn[:, None]
        succ = jax.vmap(lambda r, s: jax.ops.segment_sum(r, s, num_p))(rewards, plan.segment_ids)
        h = history_lib.update(h, ids.reshape(-1), jnp.where(drawn, succ, 0.0).reshape(-1),
                               jnp.where(drawn, plan.counts, 0).reshape(-1))

        p_true = jnp.exp(fam.log_success_probs(params, train))[ids]  # [R, P]
        kap = method.expected_scale(p_true, plan.counts, n_min=setup.n_min,
                                    pilot_successes=k1).reshape(-1)
        nonempty = drawn & (plan.counts > 0)
        seen = drawn & ~jnp.isnan(p_hat)
        err = jnp.sum(jnp.where(seen, jnp.abs(jnp.nan_to_num(p_hat) - p_true), 0.0))
        none = jnp.where(jnp.any(kept), 0.0, jnp.nan)  # κ of an empty batch: undefined
        row = jnp.stack([
            cos,
            jnp.sum(jnp.where(kept, kap, 0.0)) / n_kept + none,
            jnp.min(jnp.where(kept, kap, jnp.inf)) + none,
            jnp.mean(pk.keep.astype(jnp.float32)),
            jnp.sum(nonempty & pk.informative) / jnp.maximum(jnp.sum(nonempty), 1),
            jnp.sum(jnp.where(pk.drawn[:, None], rewards, 0.0)) / (pk.rounds * budget),
            jnp.where(jnp.any(seen), err / jnp.maximum(jnp.sum(seen), 1), jnp.nan),
            optax.global_norm(grads),
            loss,
            pk.generated,
        ]).astype(jnp.float32)
        return (new_params, opt_state, h), (row, plan.counts[0])

    return step


__all__ = ["REFILL_TAG", "Packing", "make_step", "min_group", "pack", "refill_ids",
           "round_uniforms"]
