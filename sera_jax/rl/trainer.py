"""The on-policy RL trainer: history -> allocate -> sample -> verify -> advantages -> AdamW.

One step (`Trainer.step`), fully on-policy (one optimiser update per step, importance
ratio 1, no KL, no entropy bonus):

1. take the next P prompt ids of the epoch's permutation (data position = (epoch, cursor));
   when the order wraps, a new epoch starts: `history.start_epoch` folds the pending
   outcomes in and the next permutation (a deterministic function of (seed, epoch)) is used;
2. p̂_q = frozen history estimate (NaN for unseen prompts);
3. allocate the budget B = P·N0 with the method's allocator (`objective.plan_rollouts`:
   counts N_q summing to B, multiplicity weights w_q = N0/N_q, 0 for inactive prompts);
4. flat rollout batch: prompt q repeated N_q times, B rows, `segment_ids[r]` = prompt of
   row r; static shapes whatever the counts;
5. sample (`sampling.generate_rows`: jit, batch-sharded rows, `sampling.batch_size` rows per
   call, each call prefilling its distinct prompts once for all their rollouts on one batch
   shard) and score every completion with the task verifier (host);
6. ragged advantages (the method's estimator, MaxRL by default) and per-rollout weights
   (`objective.rollout_coefficients`);
7. loss (`estimators.policy_gradient_loss`, the chosen aggregation, normalisers of the whole
   batch so micro-batch losses add up exactly), gradients accumulated over static
   micro-batches (bounded memory) by a loop that visits only the micro-batches holding a
   row with w_r A_r != 0 (the others add exactly 0; `skip_zero_advantage` packs the live
   rows into the first micro-batches), one AdamW update (global-norm clip);
8. `history.update_from_rollouts` (pending until the next epoch), metrics.

A method with DAPO dynamic sampling repeats 1-6 in rounds until its B rows hold informative
groups, updating the history per round (`sera_jax.rl.dynamic`). A stateful allocator (gdro)
reads and returns its controller state, carried in `TrainState.alloc_state`; a two-stage one
(`sera_sequential`, `pilot_commit`) samples and scores an in-step pilot before allocating,
and trains each prompt's pilot and commit rollouts pooled (`sera_jax.rl.collect`).

The trainable state is an explicit pytree (`TrainState`: params, optimiser state, history,
PRNG key, step, data position, a stateful method's allocator state), checkpointed as a
whole; `RLProgram` runs it on the one training loop (`sera_jax.loop.run`), which resumes
from the latest checkpoint of a run directory and reproduces the uninterrupted run exactly
(same XLA programs on the same inputs).

Multi-host: every process runs the same host code on the same values (prompt order,
allocation, advantages are deterministic), so batches are built identically everywhere;
devices own their rows while sampling and training, and completions are all-gathered so
every process scores every row (verifiers cost little next to sampling).

Sampling log-probabilities: the loss differentiates the model's temperature-1 unfiltered
policy. Training is exactly on-policy when `sampling.temperature == 1`, `top_p == 1` and
`top_k == 0` (the spec's setting); other settings train the unfiltered policy on filtered
samples, as most public RL code does.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
from absl import logging
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from sera_jax import history as history_lib
from sera_jax import optim
from sera_jax import sharding as shd
from sera_jax.estimators import policy_gradient_loss
from sera_jax.loop import guarded_update
from sera_jax.methods import Method
from sera_jax.models.logprobs import shared_prefix_logprobs, token_logprobs
from sera_jax.rl import config as config_lib
from sera_jax.rl import dynamic
from sera_jax.rl.collect import collect_round, shuffle_rewards
from sera_jax.rl.data import epoch_permutation, next_prompt_ids
from sera_jax.rl.state import PrefixBatch, RolloutBatch, Rollouts, TrainState
from sera_jax.sampling import SampleOutput, SamplingConfig, default_row_keys, generate_rows
from sera_jax.scaling import kappa
from sera_jax.tasks.base import RLTask

#: Compiled train-step programs shared by Trainers of the same run shape (see Trainer).
_PROGRAMS: dict[Any, tuple] = {}


# ----------------------------------------------------------------------------- helpers


def fuses_adamw(config: ml_collections.ConfigDict) -> bool:
    """Whether the train step uses `fused_adamw_step` (AdamW on a constant learning rate with
    decay on every parameter); any other `config.optimizer` takes optax's update."""
    o = config.optimizer
    return (o.get("name", "adamw") == "adamw" and o.get("schedule", "constant") == "constant"
            and o.get("weight_decay_mask", "all") == "all")


def fused_adamw_step(config: ml_collections.ConfigDict, params: Any, opt_state: Any,
                     grads: Any, apply: jax.Array) -> tuple[Any, Any]:
    """`optim.make_optimizer(config.optimizer)`'s update (global-norm clip + AdamW on a
    constant learning rate, `fuses_adamw`) as one expression per
    leaf that returns the new parameters and optimiser state, applied only when `apply`:

        g' = a · s · g,   s = 1 if ‖g‖ < clip else clip / ‖g‖,   a = [apply]  (g' = 0 if not)
        m' = m + a·((1 - b1) g' + b1 m - m),   v' = v + a·((1 - b2) g'^2 + b2 v - v)
        p' = p + a · (-lr) · [ (m' / (1 - b1^(t+1))) / (sqrt(v' / (1 - b2^(t+1))) + eps) + wd p ]
        t' = t + a

    With a = 0 every leaf is returned exactly (finite terms times 0), so a non-finite
    gradient leaves parameters and moments untouched. The values equal optax's
    clip_by_global_norm + adamw up to float rounding (tested); the state keeps optax's
    pytree, so checkpoints are interchangeable. Why not optax's chain: written as updates
    then `apply_updates` (or with array `where`s), XLA:CPU writes the new parameters and
    moments to fresh buffers on every step instead of updating the donated ones in place;
    this form is one in-place loop per leaf (3 x 135 MB: 49k page faults and 0.13 s per
    step with optax, 0 and 0.044 s this way).
    """
    o = config.optimizer
    adam_chain = opt_state[1] if o.grad_clip > 0 else opt_state
    adam = adam_chain[0]  # optax.ScaleByAdamState(count, mu, nu)
    norm = optax.global_norm(grads)
    a = apply.astype(jnp.float32)
    scale = (jnp.where(norm < o.grad_clip, 1.0, o.grad_clip / norm) if o.grad_clip > 0
             else jnp.float32(1.0))
    scale = jnp.where(apply, scale, 0.0)
    count = optax.safe_increment(adam.count)  # t + 1 >= 1: finite bias corrections always
    inv_bias1, inv_bias2 = 1 / (1 - o.b1 ** count), 1 / (1 - o.b2 ** count)

    def leaf(p, m, v, g):
        g = jnp.where(apply, g, 0) * scale.astype(g.dtype)  # no NaN reaches the 0-blend
        m2 = m + a * ((1 - o.b1) * g + o.b1 * m - m)
        v2 = v + a * ((1 - o.b2) * (g * g) + o.b2 * v - v)
        u = (m2 * inv_bias1) / (jnp.sqrt(v2 * inv_bias2) + o.eps)
        return (p + a * ((u + o.weight_decay * p) * -o.learning_rate)).astype(p.dtype), m2, v2

    out = jax.tree.map(leaf, params, adam.mu, adam.nu, grads)
    part = lambda k: jax.tree.map(lambda t: t[k], out, is_leaf=lambda t: isinstance(t, tuple))  # noqa: E731
    adam = adam._replace(count=jnp.where(apply, count, adam.count), mu=part(1), nu=part(2))
    adam_chain = (adam, *adam_chain[1:])
    return part(0), ((opt_state[0], adam_chain) if o.grad_clip > 0 else adam_chain)


def _split_micro(x: jax.Array, num_micro: int, mesh: Mesh) -> jax.Array:
    """[B, ...] -> [M, B/M, ...]; micro-batch m holds rows r with r % M == m.

    Strided (not contiguous) micro-batches keep every micro-batch spread over all batch
    shards: the reshape [B] -> [B/M, M] leaves the sharded dimension in place, so no data
    moves between devices.
    """
    b = x.shape[0]
    x = x.reshape(b // num_micro, num_micro, *x.shape[1:])
    x = jnp.swapaxes(x, 0, 1)
    spec = PartitionSpec(None, shd.BATCH_AXES, *([None] * (x.ndim - 2)))
    return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, spec))


def _live_micro(batch: RolloutBatch | PrefixBatch, num_micro: int) -> jax.Array:
    """bool [M]: micro-batch m (rows r with r % M == m, `_split_micro`; row block m of a
    `PrefixBatch`) holds a row with w_r A_r != 0."""
    live = batch.advantages * batch.weights != 0
    if isinstance(batch, PrefixBatch):
        return jnp.any(live, axis=1)
    return jnp.any(live.reshape(-1, num_micro), axis=0)


def pack_live_rows(live: np.ndarray, num_micro: int) -> np.ndarray:
    """Row order that fills the trainer's micro-batches with the `live` rows (bool [B],
    c_r = w_r A_r != 0) first.

    `order[i]` = the rollout placed at batch position i. Micro-batch m holds positions
    i with i % M == m (`_split_micro`), so the live rows, in their original order, go to
    the positions of micro-batch 0, then 1, ...; the rows with c_r = 0 fill the rest, and
    micro-batches holding only those are skipped by the train step. Gradient unchanged up
    to the order of float summation (which rows share a micro-batch).
    """
    b = len(live)
    slots = np.arange(b).reshape(b // num_micro, num_micro).T.ravel()  # micro-batch-major
    order = np.empty(b, np.int64)
    order[slots] = np.argsort(~np.asarray(live, bool), kind="stable")
    return order


def prefix_layout(segment_ids: np.ndarray, live: np.ndarray, micro: int, pack: bool,
                  max_slots: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Rows and prompt slots of a `PrefixBatch` (host): returns (order [B], slots [M, S],
    row_slot [M, R]).

    Micro-batch m holds the contiguous rows `order[m R:(m + 1) R]` (R = `micro`); `pack`
    puts the `live` rows (c_r != 0) first, in their original order, so the rest fill
    micro-batches the train step skips. `slots[m]` are the distinct prompts (segment ids)
    of micro-batch m, padded by repeating its last one to S = the most distinct prompts of
    any micro-batch holding a live row, rounded up to a power of two and capped at
    `max_slots` (>= that count): few compiled shapes. Micro-batches without a live row are
    never computed, so theirs are cut to S (rows past it point at slot S - 1); SERA's
    all-fail / all-success prompts at n_min rows would otherwise set S for every block.
    `row_slot[m, i]` is the slot row i of micro-batch m continues.
    """
    b = len(segment_ids)
    live = np.asarray(live, bool)
    order = np.argsort(~live, kind="stable") if pack else np.arange(b)
    seg = np.asarray(segment_ids)[order].reshape(b // micro, micro)
    block_live = live[order].reshape(b // micro, micro).any(axis=1)
    distinct = [np.unique(row) for row in seg]  # one per micro-batch (M = B / R of them)
    need = max([len(u) for u, on in zip(distinct, block_live) if on], default=1)
    s = max(need, min(1 << (need - 1).bit_length(), max_slots))
    distinct = [u[:s] for u in distinct]
    slots = np.stack([np.pad(u, (0, s - len(u)), mode="edge") for u in distinct])
    row_slot = np.stack([np.minimum(np.searchsorted(u, row), s - 1)
                         for u, row in zip(distinct, seg)])
    return order, slots, row_slot.astype(np.int32)


def rollout_loss(
    model: nnx.Module,
    batch: RolloutBatch | PrefixBatch,
    *,
    aggregation: str,
    num_prompts: int,
    n0: int,
    max_len: int,
    num_tokens: jax.Array,
) -> jax.Array:
    """Policy-gradient surrogate of a (micro-)batch: recompute log π of the completions
    under `model` (one forward over prompt + completion, the vocabulary head only where a
    completion token is predicted; for one micro-batch of a `PrefixBatch`, each prompt slot's
    forward once, `logprobs.shared_prefix_logprobs`) and apply
    `estimators.policy_gradient_loss` with whole-batch normalisers (P·N0, `num_tokens`)."""
    if isinstance(batch, PrefixBatch):
        logprobs = shared_prefix_logprobs(model, batch.prompt_tokens, batch.prompt_mask,
                                          batch.row_prompt, batch.completion_tokens,
                                          batch.completion_mask)
    else:
        width = batch.prompt_tokens.shape[1]
        tokens = jnp.concatenate([batch.prompt_tokens, batch.completion_tokens], axis=1)
        mask = jnp.concatenate([batch.prompt_mask, batch.completion_mask], axis=1)
        logprobs = token_logprobs(model, tokens, mask, start=width)
    return policy_gradient_loss(
        logprobs, batch.completion_mask, batch.advantages, batch.weights,
        aggregation=aggregation, num_prompts=num_prompts, n0=n0, max_len=max_len,
        num_tokens=num_tokens,
    )


# ----------------------------------------------------------------------------- trainer


class Trainer:
    """Builds the jitted programs for one (config, task, model graph, mesh) and runs steps.

    Usage::

        trainer = Trainer(config, task, model, mesh, method=method)  # a methods.Method
        state = trainer.init_state(model)          # sharded onto the mesh
        for _ in range(n):
            state, metrics = trainer.step(state)

    `model` is only read for its graph and parameters; the trainer never mutates it.
    """

    def __init__(self, config: ml_collections.ConfigDict, task: RLTask, model: nnx.Module,
                 mesh: Mesh | None = None, rules: Mapping[str, Any] = shd.LOGICAL_RULES, *,
                 method: Method | None = None):
        # The method (allocator + options + multiplicity + estimator): as resolved by the
        # study, or else resolved here from `config.method` and its overrides, once.
        self.method = config_lib.validate(config, method)

        self.config = config
        self.task = task
        self.mesh = mesh if mesh is not None else shd.make_mesh(dict(config.mesh))
        self.num_prompts = int(task.split_size(config.split))
        self.batch_prompts = int(config.prompts_per_step)
        if self.batch_prompts > self.num_prompts:
            raise ValueError(f"config.prompts_per_step={self.batch_prompts} exceeds the "
                             f"{self.num_prompts} prompts of split {config.split!r}")
        self.budget = config_lib.budget(config)
        self.micro = int(config.micro_batch_size) or self.budget
        self.sample_rows = int(config.sampling.batch_size) or self.budget
        self.share_prefix = bool(config.get("share_prompt_prefix", False))
        divisor = shd.batch_divisor(self.mesh)
        for field, rows in (("micro_batch_size", self.micro),
                            ("sampling.batch_size", self.sample_rows)):
            if rows % divisor:
                raise ValueError(f"config.{field} gives {rows} rows per call, not a multiple of "
                                 f"the {divisor} batch shards of mesh {dict(self.mesh.shape)}")
        self.kappa_shift = self.method.kappa_shift
        self.tx = optim.make_optimizer(config.optimizer, config.num_steps)

        s = config.sampling
        greedy = s.temperature == 0
        self.sampling = SamplingConfig(
            max_new_tokens=int(task.max_new_tokens), temperature=1.0 if greedy else s.temperature,
            top_p=s.top_p, top_k=s.top_k, greedy=greedy, stop_ids=tuple(task.stop_ids),
            pad_id=int(task.pad_id), cache_dtype=s.get("kv_cache_dtype", "") or None)
        self.loss_len = int(config.loss_norm_length) or int(task.max_new_tokens)

        self.graphdef, params = nnx.split(model)
        low = sorted({str(x.dtype) for x in jax.tree.leaves(params)
                      if jnp.issubdtype(x.dtype, jnp.floating) and x.dtype != jnp.float32})
        if low:
            # AdamW's moments take the parameters' dtype, and a bf16 master weight drops
            # every update below 2^-8 of its magnitude (lr 1e-5 updates vanish).
            logging.warning("training %s master weights (and AdamW moments); keep "
                            "param_dtype float32 and set the compute dtype instead", low)
        self.param_shardings = shd.state_shardings(params, self.mesh, rules)
        abstract_opt = jax.eval_shape(self.tx.init, params)
        self.opt_shardings = optax.tree_map_params(
            self.tx, lambda _, s: s, abstract_opt, self.param_shardings,
            transform_non_params=lambda _: shd.replicated(self.mesh),
            is_leaf=lambda x: isinstance(x, nnx.Variable))
        rep = shd.replicated(self.mesh)
        self.history_shardings = jax.tree.map(
            lambda _: rep, history_lib.SuccessHistory.create(1))
        self.state_shardings = TrainState(
            params=self.param_shardings, opt_state=self.opt_shardings,
            history=self.history_shardings, key=rep, step=rep, epoch=rep, cursor=rep,
            alloc_state=jax.tree.map(lambda _: rep, self.method.init_state()))
        # Jitted programs are cached per (graph, shapes, shardings, loss and optimiser
        # settings): a second Trainer for the same run shape (a restart, an ablation arm in
        # the same process) reuses the compiled step instead of recompiling it.
        key = (self.graphdef, self.mesh,
               tuple((jax.tree_util.keystr(p), x.shape, x.dtype, s) for (p, x), s in zip(
                   jax.tree_util.tree_flatten_with_path(params)[0],
                   jax.tree.leaves(self.param_shardings))),
               self.budget, self.micro, self.batch_prompts, config.aggregation,
               int(config.rollouts_per_prompt), self.loss_len, config.optimizer.to_json(),
               self.share_prefix)
        if key not in _PROGRAMS:
            _PROGRAMS[key] = self._build_programs()
        self.tx, self._train_step, self.gradients, self.batch_shardings = _PROGRAMS[key]

    # --------------------------------------------------------------- state

    def init_state(self, model: nnx.Module) -> TrainState:
        """Fresh state from `model`'s parameters: zero optimiser moments, empty history,
        key from `config.seed`, step 0, data position (0, 0); placed on the mesh."""
        # A copy (never an alias): the train step donates params, and the caller's model
        # must stay usable (e.g. to evaluate the initial policy after training). jnp.copy
        # first: device_put(may_alias=False) onto a multi-device sharding still reuses the
        # source buffer for one shard (jax 0.10), which donation would then delete.
        params = jax.device_put(jax.tree.map(jnp.copy, nnx.state(model)), self.param_shardings)
        opt_state = jax.jit(self.tx.init, out_shardings=self.opt_shardings)(params)
        h = self.config.history
        history = history_lib.SuccessHistory.create(self.num_prompts, h.alpha, h.beta, h.gamma)
        key = jax.random.key_data(jax.random.key(self.config.seed))
        host = dict(history=history, key=key, step=np.int32(0), epoch=np.int32(0),
                    cursor=np.int32(0), alloc_state=self.method.init_state())
        host = shd.replicate(jax.tree.map(np.asarray, host), self.mesh)
        return TrainState(params=params, opt_state=opt_state, **host)

    def abstract_state(self, state: TrainState) -> TrainState:
        """ShapeDtypeStructs (with shardings) of `state`: the restore target."""
        return jax.tree.map(
            lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
            state, self.state_shardings)

    def model(self, state: TrainState) -> nnx.Module:
        """The policy with `state`'s parameters (a view for sampling / evaluation)."""
        return nnx.merge(self.graphdef, state.params)

    # --------------------------------------------------------------- jitted programs

    def _build_programs(self):
        c = self.config
        graphdef, mesh, tx = self.graphdef, self.mesh, self.tx
        num_micro = self.budget // self.micro
        loss_kwargs = dict(aggregation=c.aggregation, num_prompts=self.batch_prompts,
                           n0=int(c.rollouts_per_prompt), max_len=self.loss_len)

        def loss_fn(params, batch, num_tokens):
            model = nnx.merge(graphdef, params)
            return rollout_loss(model, batch, num_tokens=num_tokens, **loss_kwargs)

        grad_fn = jax.value_and_grad(loss_fn)

        def gradients(params, batch: RolloutBatch):
            # Whole-batch token count: micro-batch token-mean losses then add up exactly.
            num_tokens = jnp.sum(batch.completion_mask, dtype=jnp.float32)
            zeros = (jnp.float32(0), jax.tree.map(jnp.zeros_like, params))
            # Every loss term is c_r = w_r A_r times a log-probability, so a micro-batch whose
            # c_r are all 0 adds exactly 0 to the loss and the gradient (unless its
            # log-probabilities are not finite: then the skip hides what would have tripped
            # the finite guard): only the live micro-batches are computed.
            if isinstance(batch, PrefixBatch):  # already [M, ...] micro-batches
                micro = batch
            elif num_micro == 1:
                return jax.lax.cond(_live_micro(batch, 1)[0],
                                    lambda: grad_fn(params, batch, num_tokens), lambda: zeros)
            else:
                micro = jax.tree.map(lambda x: _split_micro(x, num_micro, mesh), batch)
            # A loop over the live micro-batches: a dynamic trip count (one compiled program
            # for any number of them), so not reverse-differentiable (nothing needs that).
            live = _live_micro(batch, num_micro)
            order = jnp.argsort(~live, stable=True)  # live micro-batches first, in order

            def body(i, carry):
                loss, grads = carry
                mb = jax.tree.map(lambda x: x[order[i]], micro)
                micro_loss, g = grad_fn(params, mb, num_tokens)
                return loss + micro_loss, jax.tree.map(jnp.add, grads, g)

            return jax.lax.fori_loop(0, jnp.sum(live), body, zeros)

        fused = (lambda *args: fused_adamw_step(c, *args)) if fuses_adamw(c) else None
        clip = float(c.optimizer.get("grad_clip", optim.DEFAULTS["grad_clip"]))  # `clipped`

        def train_step(params, opt_state, batch: RolloutBatch):
            loss, grads = gradients(params, batch)
            params, opt_state, metrics = guarded_update(tx, params, opt_state, loss, grads,
                                                        step=fused, grad_clip=clip)
            # Counted where the skip happens (the host's `trained_micro_batches` predicts it).
            metrics["trained_micro_batches"] = jnp.sum(_live_micro(batch, num_micro),
                                                       dtype=jnp.float32)
            return params, opt_state, metrics

        rep = shd.replicated(mesh)
        if self.share_prefix:  # rows split along R of [M, R, ...]; prompt slots replicated
            rows = lambda ndim: shd.batch_sharding(mesh, ndim, axis=1)  # noqa: E731
            batch_shardings = PrefixBatch(rep, rep, rows(2), rows(3), rows(3), rows(2), rows(2))
        else:
            rows = lambda ndim: shd.batch_sharding(mesh, ndim)  # noqa: E731
            batch_shardings = RolloutBatch(rows(2), rows(2), rows(2), rows(2), rows(1), rows(1))
        # `(loss, grads) = trainer.gradients(params, batch)`: the accumulated gradient of one
        # step's loss (not donating; for tests and gradient analyses).
        gradients_jit = jax.jit(gradients, in_shardings=(self.param_shardings, batch_shardings),
                                out_shardings=(rep, self.param_shardings))
        train_step_jit = jax.jit(
            train_step,
            in_shardings=(self.param_shardings, self.opt_shardings, batch_shardings),
            out_shardings=(self.param_shardings, self.opt_shardings, rep),
            donate_argnums=(0, 1),
        )
        return tx, train_step_jit, gradients_jit, batch_shardings

    # --------------------------------------------------------------- one step

    def sample(self, state: TrainState, prompts: np.ndarray, prompt_mask: np.ndarray,
               segment_ids: np.ndarray, key: jax.Array, row_keys: jax.Array | None = None
               ) -> SampleOutput:
        """Sample one completion per row r of prompt `segment_ids[r]` (host [P, W] prompts),
        `sampling.batch_size` rows per call, each call prefilling its distinct prompts once
        (on one batch shard; `sampling.generate_rows`); row r uses key `row_keys[r]`
        (default `fold_in(key, r)`) however the rows are chunked. Host arrays."""
        keys = default_row_keys(key, segment_ids.shape[0]) if row_keys is None else row_keys
        # A fixed number of prompt slots per call (at most P prompts can occur in a call):
        # one compiled sampler whatever the allocation puts in a chunk.
        return generate_rows(self.model(state), prompts, prompt_mask, segment_ids, keys,
                             self.sampling, rows_per_call=self.sample_rows, mesh=self.mesh,
                             prompt_slots=min(self.batch_prompts, self.sample_rows))

    def collect(self, state: TrainState) -> tuple[Rollouts, history_lib.SuccessHistory, Any]:
        """Steps 1-6 of the module docstring: choose prompts, allocate, sample, score and
        compute advantages/weights. Returns the host record, the history after any epoch
        start, and the PRNG key to carry on. A dynamic-sampling method draws rounds until
        its batch is full (`rl.dynamic.collect`; the history then holds every round)."""
        if self.method.dynamic_sampling:
            return dynamic.collect(self, state)
        epoch, cursor = int(shd.to_host(state.epoch)), int(shd.to_host(state.cursor))
        ids, epoch, cursor, started = next_prompt_ids(
            self.config.seed, self.num_prompts, self.batch_prompts, epoch, cursor)
        history = state.history
        for _ in range(started):
            history = history_lib.start_epoch(history)
        key = jax.random.wrap_key_data(jnp.asarray(shd.to_host(state.key)))
        key, sample_key = jax.random.split(key)
        return self.collect_round(state, history, ids, epoch, cursor, sample_key), history, key

    def collect_round(self, state: TrainState, history: history_lib.SuccessHistory,
                      ids: np.ndarray, epoch: int, cursor: int, sample_key: jax.Array
                      ) -> Rollouts:
        """Steps 2-6 for the P prompts `ids` (data position after them: epoch, cursor), for
        one-shot, stateful and two-stage (in-step pilot) methods: `rl.collect`."""
        return collect_round(self, state, history, ids, epoch, cursor, sample_key)

    def device_batch(self, rollouts: Rollouts) -> RolloutBatch | PrefixBatch:
        """The rollouts as a `RolloutBatch` of global arrays on the batch sharding: the
        completions cut to `train_width`; with `config.skip_zero_advantage` in
        `pack_live_rows` order (the loss is a sum over rows). With
        `config.share_prompt_prefix` a `PrefixBatch` (`prefix_layout`) instead."""
        r = rollouts
        width = self.train_width(r)
        if self.share_prefix:
            return self._prefix_batch(r, width)
        fields = (r.prompt_tokens, r.prompt_mask, r.completion_tokens[:, :width],
                  r.completion_mask[:, :width], r.advantages, r.weights)
        if self.config.get("skip_zero_advantage", False):
            order = pack_live_rows(r.live, self.budget // self.micro)
            fields = tuple(x[order] for x in fields)
        return RolloutBatch(*shd.shard_batch(fields, self.mesh))

    def _prefix_batch(self, r: Rollouts, width: int) -> PrefixBatch:
        order, slots, row_slot = prefix_layout(
            r.segment_ids, r.live, self.micro, self.config.get("skip_zero_advantage", False),
            min(self.micro, self.batch_prompts))
        m = self.budget // self.micro
        some_row = np.zeros(max(self.batch_prompts, int(r.segment_ids.max()) + 1),
                            np.int64)  # any row of prompt q holds it
        some_row[r.segment_ids] = np.arange(self.budget)
        prompt_rows = some_row[slots]  # [M, S]
        micro = lambda x: x[order].reshape(m, self.micro, *x.shape[1:])  # noqa: E731
        prompts = shd.replicate((r.prompt_tokens[prompt_rows], r.prompt_mask[prompt_rows]),
                                self.mesh)
        rows = shd.shard_batch((row_slot, micro(r.completion_tokens[:, :width]),
                                micro(r.completion_mask[:, :width]), micro(r.advantages),
                                micro(r.weights)), self.mesh, axis=1)
        return PrefixBatch(*prompts, *rows)

    def train_width(self, rollouts: Rollouts) -> int:
        """Completion positions the train step sees: max_new_tokens, or with
        `config.train_length_bucket` = N the longest completion rounded up to a multiple of
        N (at most max_new_tokens). Positions past every row's last token are padding, which
        no earlier position attends to, so cutting them leaves the loss unchanged."""
        full = rollouts.completion_tokens.shape[1]
        bucket = int(self.config.get("train_length_bucket", 0))
        if not bucket:
            return full
        return min(full, max(1, -(-int(rollouts.lengths.max()) // bucket)) * bucket)

    def trained_micro_batches(self, rollouts: Rollouts) -> int:
        """How many of the step's micro-batches the train step computes (the others hold
        only rows with c_r = w_r A_r = 0 and are skipped)."""
        num_micro = self.budget // self.micro
        live = rollouts.live
        if self.config.get("skip_zero_advantage", False):
            return -(-int(live.sum()) // self.micro)
        if self.share_prefix:  # contiguous row blocks
            return int(live.reshape(num_micro, self.micro).any(axis=1).sum())
        return int(live.reshape(self.micro, num_micro).any(axis=0).sum())

    def step(self, state: TrainState, *, return_rollouts: bool = False):
        """One on-policy step (see the module docstring).

        Returns `(new_state, metrics)`, or `(new_state, metrics, rollouts)` when
        `return_rollouts`. `state.params` and `state.opt_state` are donated (invalid after).
        """
        t0 = time.perf_counter()
        rollouts, history, key = self.collect(state)
        t_train = time.perf_counter()
        with jax.set_mesh(self.mesh):
            params, opt_state, train_metrics = self._train_step(
                state.params, state.opt_state, self.device_batch(rollouts))
        # The metrics depend on the updated parameters (param_norm), so fetching them waits
        # for the whole update: the end of the train phase.
        train_metrics = {k: float(shd.to_host(v)) for k, v in train_metrics.items()}
        t_train = time.perf_counter() - t_train
        if not self.method.dynamic_sampling:  # (dynamic sampling: updated per round)
            history = history_lib.update_from_rollouts(
                history, jnp.asarray(rollouts.prompt_ids), jnp.asarray(rollouts.segment_ids),
                jnp.asarray(rollouts.rewards))
        new_state = TrainState(
            params=params, opt_state=opt_state,
            history=shd.replicate(jax.tree.map(shd.to_host, history), self.mesh),
            **shd.replicate(dict(key=np.asarray(jax.random.key_data(key)),
                                 step=np.int32(shd.to_host(state.step) + 1),
                                 epoch=np.int32(rollouts.epoch),
                                 cursor=np.int32(rollouts.cursor)), self.mesh),
            alloc_state=shd.replicate(rollouts.alloc_state, self.mesh)
            if self.method.stateful else None)
        metrics = (dynamic.metrics(self, rollouts) if self.method.dynamic_sampling
                   else self.rollout_metrics(rollouts))
        metrics.update(train_metrics)
        metrics.update(epoch=float(rollouts.epoch), step_time=time.perf_counter() - t0,
                       sample_time=rollouts.sample_time, score_time=rollouts.score_time,
                       train_time=t_train,
                       tokens_per_s=metrics["generated_tokens"] / max(rollouts.sample_time,
                                                                      1e-9))
        return (new_state, metrics, rollouts) if return_rollouts else (new_state, metrics)

    def rollout_metrics(self, r: Rollouts) -> dict[str, float | None]:
        """The step metrics of record `r`: reward, mixed / active prompts, rollout counts,
        κ over the seen prompts, generated rollouts and tokens, truncation, live rows and
        train width (a dynamic-sampling step computes them on everything it generated)."""
        p_hat, counts, segment_ids, rewards = r.p_hat, r.counts, r.segment_ids, r.rewards
        lengths, truncated = r.lengths, r.truncated
        active = counts > 0
        successes = np.bincount(segment_ids, weights=rewards, minlength=len(counts))
        mixed = active & (successes > 0) & (successes < counts)
        act_counts = counts[active].astype(np.float64)
        seen = active & np.isfinite(p_hat)
        # κ over all P prompts (a static shape: one compile per run, not one per count of
        # seen prompts), then the seen ones picked on the host.
        k = np.asarray(kappa(jnp.asarray(np.where(seen, p_hat, 0.0)), jnp.asarray(counts),
                             self.kappa_shift))[seen]
        if seen.any():
            kappa_min, kappa_mean = float(k.min()), float(k.mean())
        else:  # no estimate yet (first epoch): κ is undefined, recorded as None
            kappa_min = kappa_mean = None
        return {
            "reward_mean": float(rewards.mean()),
            "mixed_fraction": float(mixed.sum() / max(active.sum(), 1)),
            "active_prompts": float(active.sum()),
            "rollouts_min": float(act_counts.min()),
            "rollouts_max": float(act_counts.max()),
            "rollouts_std": float(act_counts.std()),
            "kappa_min": kappa_min,
            "kappa_mean": kappa_mean,
            "generated_rollouts": float(len(rewards)),
            "generated_tokens": float(lengths.sum()),
            "truncated_fraction": float(truncated.mean()),
            # Rows whose loss coefficient w_r A_r is non-zero (all-fail / all-success groups
            # have A = 0 under MaxRL and GRPO): the share of the batch that moves the policy.
            "live_row_fraction": float(np.mean(r.live)),
            "train_width": float(self.train_width(r)),
        }


class RLProgram:
    """A `Trainer` from the initial policy `model` as a `sera_jax.loop.Program`."""

    def __init__(self, trainer: Trainer, model: nnx.Module):
        self.trainer, self.model = trainer, model

    def init_state(self) -> TrainState:
        return self.trainer.init_state(self.model)

    def abstract_state(self, state: TrainState) -> TrainState:
        return self.trainer.abstract_state(state)

    def step(self, state: TrainState, step: int) -> tuple[TrainState, dict[str, float | None]]:
        return self.trainer.step(state)

    def position(self, state: TrainState) -> dict[str, int]:
        return {"epoch": int(shd.to_host(state.epoch)), "cursor": int(shd.to_host(state.cursor))}


#: Fingerprint fields (under the run's `rl.`) that a resumed RL run may change: how long and
#: how often, never what (the learning rate is constant, so a longer run continues exactly).
#: `rl.async_checkpoint` is also left out of `config.fingerprint`; it stays listed for
#: fingerprints that embed the raw config (a study's `to_dict()` of a block).
RESUMABLE = ("rl.num_steps", "rl.log_every", "rl.checkpoint_every", "rl.max_checkpoints_to_keep",
             "rl.multihost", "rl.async_checkpoint")


def initialize_distributed(config: ml_collections.ConfigDict) -> bool:
    """`jax.distributed.initialize` when `config.multihost.enabled` (before any JAX op)."""
    m = config.multihost
    return shd.initialize_distributed(m.enabled, m.coordinator_address or None,
                                      m.num_processes or None,
                                      m.process_id if m.process_id >= 0 else None)


__all__ = [
    "RESUMABLE",
    "RLProgram",
    "RolloutBatch",
    "Rollouts",
    "TrainState",
    "Trainer",
    "epoch_permutation",
    "initialize_distributed",
    "fuses_adamw",
    "fused_adamw_step",
    "next_prompt_ids",
    "rollout_loss",
    "shuffle_rewards",
]
