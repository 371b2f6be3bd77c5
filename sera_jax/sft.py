"""Supervised fine-tuning (next-token prediction) on prompt + answer, loss on answer tokens.

Used by the maze experiment to train the policy from scratch on shortest paths before RL
(SERA_SPEC §7: AdamW 5e-4, β (0.9, 0.95), wd 0.01, cosine schedule, clip 1.0).

    loss(θ) = − Σ_{b,t} m[b,t] log π_θ(y[b,t] | y[b,<t]) / Σ_{b,t} m[b,t]

where the sequence `y` is prompt ‖ answer (right-padded) and the mask `m` is 1 exactly on
the answer tokens (token-mean over the batch's answer tokens).

The step is one `jax.jit` program over the model's `nnx.State`: parameters carry
`NamedSharding`s from `sera_jax.sharding` (the same partition rules as the RL trainer), the
batch is split over the mesh's batch axes, and parameters / optimiser state are donated.
Batches are a pure function of (seed, step), so a resumed run replays the same data: the
checkpoint (`sera_jax.checkpoint.Checkpointer`) holds parameters, optimiser state and step.
"""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
from flax import nnx

from sera_jax import sharding as shd
from sera_jax.checkpoint import (
    Checkpointer,
    CheckpointError,
    check_resume_config,
    config_meta,
)
from sera_jax.models.decoder import token_logprobs


def get_config() -> ml_collections.ConfigDict:
    """SFT defaults (the spec's maze SFT recipe; sizes are overridden by experiments)."""
    c = ml_collections.ConfigDict()
    c.seed = 0
    c.split = "sft"  # task split whose (prompt, answer) pairs are trained on
    c.num_steps = 1500
    c.batch_size = 32
    c.learning_rate = 5e-4
    c.warmup_steps = 0  # linear warmup from 0, then cosine decay to 0 at num_steps
    c.b1 = 0.9
    c.b2 = 0.95
    c.weight_decay = 0.01
    c.grad_clip = 1.0
    c.log_every = 50
    c.checkpoint_every = 500  # 0 = only the final step
    c.max_checkpoints_to_keep = 2
    return c


def validate(config: ml_collections.ConfigDict) -> None:
    """Raise ValueError naming the field for an invalid SFT setting."""
    c = config
    checks = [
        (isinstance(c.num_steps, int) and c.num_steps >= 1, "num_steps", c.num_steps, ">= 1"),
        (c.batch_size >= 1, "batch_size", c.batch_size, ">= 1"),
        (c.learning_rate >= 0, "learning_rate", c.learning_rate, ">= 0"),
        (0 <= c.warmup_steps < c.num_steps, "warmup_steps", c.warmup_steps,
         f"[0, num_steps={c.num_steps})"),
        (0 <= c.b1 < 1, "b1", c.b1, "[0, 1)"),
        (0 <= c.b2 < 1, "b2", c.b2, "[0, 1)"),
        (c.weight_decay >= 0, "weight_decay", c.weight_decay, ">= 0"),
        (c.grad_clip >= 0, "grad_clip", c.grad_clip, ">= 0 (0 = off)"),
        (c.log_every >= 1, "log_every", c.log_every, ">= 1"),
        (c.checkpoint_every >= 0, "checkpoint_every", c.checkpoint_every, ">= 0"),
    ]
    for ok, field, value, allowed in checks:
        if not ok:
            raise ValueError(f"sft config.{field}={value!r} is invalid; allowed: {allowed}")


def make_optimizer(config: ml_collections.ConfigDict) -> optax.GradientTransformation:
    """AdamW(b1, b2, wd) on a (warmup +) cosine schedule to 0 at `num_steps`, after a
    global-norm clip. Equal settings return the same object (so the jitted step, which
    takes the optimiser as a static argument, compiles once per setting)."""
    return _optimizer(float(config.learning_rate), int(config.warmup_steps),
                      int(config.num_steps), float(config.b1), float(config.b2),
                      float(config.weight_decay), float(config.grad_clip))


@functools.lru_cache(maxsize=32)
def _optimizer(lr, warmup, steps, b1, b2, wd, clip) -> optax.GradientTransformation:
    if warmup > 0:
        schedule = optax.warmup_cosine_decay_schedule(0.0, lr, warmup, steps, 0.0)
    else:
        schedule = optax.cosine_decay_schedule(lr, steps)
    parts = [optax.clip_by_global_norm(clip)] if clip > 0 else []
    parts.append(optax.adamw(schedule, b1=b1, b2=b2, weight_decay=wd))
    return optax.chain(*parts)


def make_batch(prompts: Sequence[np.ndarray], answers: Sequence[np.ndarray], width: int,
               pad_id: int) -> dict[str, np.ndarray]:
    """Right-padded `prompt ‖ answer` rows of `width` tokens.

    Returns int32 `tokens`, bool `mask` (real tokens) and bool `loss_mask` (answer tokens,
    the prediction targets). Raises ValueError when a row does not fit in `width`.
    """
    batch = len(prompts)
    if len(answers) != batch:
        raise ValueError(f"answers has {len(answers)} rows; prompts has {batch}")
    tokens = np.full((batch, width), pad_id, np.int32)
    mask = np.zeros((batch, width), bool)
    loss_mask = np.zeros((batch, width), bool)
    for i, (p, a) in enumerate(zip(prompts, answers)):
        n_p, n_a = len(p), len(a)
        if n_p + n_a > width:
            raise ValueError(f"row {i}: prompt {n_p} + answer {n_a} tokens exceed width {width}")
        if n_a == 0:
            raise ValueError(f"row {i}: empty answer (nothing to train on)")
        tokens[i, :n_p], tokens[i, n_p:n_p + n_a] = p, a
        mask[i, :n_p + n_a] = True
        loss_mask[i, n_p:n_p + n_a] = True
    return {"tokens": tokens, "mask": mask, "loss_mask": loss_mask}


def sft_loss(model: nnx.Module, batch: dict[str, jax.Array]) -> jax.Array:
    """Token-mean negative log-likelihood of the answer tokens (`loss_mask`) of the batch."""
    logp = token_logprobs(model, batch["tokens"], batch["mask"])
    weight = batch["loss_mask"].astype(jnp.float32)
    return -(logp * weight).sum() / jnp.maximum(weight.sum(), 1.0)


@functools.partial(jax.jit, static_argnums=(0, 1), donate_argnums=(2, 3))
def _train_step(graphdef, tx, params, opt_state, batch):
    """One AdamW step on the SFT loss. Module-level jit keyed on the (hashable) graph and
    optimiser: every trainer of the same model/optimiser reuses one compiled program per
    mesh. Shardings follow the inputs (parameters and moments are updated elementwise)."""
    def loss_fn(p):
        return sft_loss(nnx.merge(graphdef, p), batch)

    loss, grads = jax.value_and_grad(loss_fn)(params)
    updates, opt_state = tx.update(grads, opt_state, params)
    params = optax.apply_updates(params, updates)
    return params, opt_state, {"loss": loss, "grad_norm": optax.global_norm(grads)}


def batch_ids(seed: int, step: int, num_examples: int, batch_size: int) -> np.ndarray:
    """Example ids of SFT step `step`: uniform with replacement, a pure function of
    (seed, step) so a resumed run sees the same batches."""
    return np.random.default_rng([int(seed), int(step)]).integers(0, num_examples, batch_size)


ExamplesFn = Callable[[np.ndarray], tuple[list[np.ndarray], list[np.ndarray]]]


#: Config fields a resumed SFT run may change (everything else must match the checkpoint).
RESUMABLE_FIELDS = ("num_steps", "log_every", "checkpoint_every", "max_checkpoints_to_keep")


class SFTTrainer:
    """Jitted, sharded SFT of an NNX decoder with Orbax checkpoints and exact resume.

    `examples(ids) -> (prompts, answers)` returns token arrays for example ids in
    `[0, num_examples)`; `width` is the static row length (>= longest prompt + answer).
    """

    def __init__(self, model: nnx.Module, config: ml_collections.ConfigDict,
                 examples: ExamplesFn, num_examples: int, width: int, pad_id: int,
                 mesh: jax.sharding.Mesh | None = None, workdir: str | None = None):
        validate(config)
        if num_examples < 1:
            raise ValueError(f"num_examples={num_examples}; need >= 1 SFT example")
        self.config = config
        self.examples, self.num_examples = examples, int(num_examples)
        self.width, self.pad_id = int(width), int(pad_id)
        self.mesh = mesh if mesh is not None else shd.make_mesh((-1, 1, 1))
        if config.batch_size % shd.batch_divisor(self.mesh):
            raise ValueError(f"sft config.batch_size={config.batch_size} must be a multiple of "
                             f"the mesh's {shd.batch_divisor(self.mesh)} batch shards")
        self.model = shd.shard_model(model, self.mesh)
        self.graphdef, params = nnx.split(self.model)
        self.tx = make_optimizer(config)
        param_sh = shd.state_shardings(params, self.mesh)
        # Optimiser moments follow their parameter's sharding; counters are replicated.
        opt_sh = optax.tree_map_params(
            self.tx, lambda _, s: s, jax.eval_shape(self.tx.init, params), param_sh,
            transform_non_params=lambda _: shd.replicated(self.mesh),
            is_leaf=lambda x: isinstance(x, nnx.Variable))
        self.params = params
        self.opt_state = jax.jit(self.tx.init, out_shardings=opt_sh)(params)
        self.step = 0
        self.ckpt = (Checkpointer(os.path.join(workdir, "sft_checkpoints"),
                                  max_to_keep=config.max_checkpoints_to_keep)
                     if workdir else None)
        if self.ckpt is not None and self.ckpt.latest_step() is not None:
            self.restore()

    # ---- checkpoints
    def _state(self) -> dict[str, Any]:
        return {"params": self.params, "opt_state": self.opt_state}

    def save(self) -> None:
        if self.ckpt is not None:
            self.ckpt.save(self.step, self._state(), {"step": self.step,
                                                      "config": config_meta(self.config)})

    def restore(self) -> None:
        """Continue from the latest checkpoint in the workdir."""
        state, meta = self.ckpt.restore(self._state())
        check_resume_config(meta, self.config, self.ckpt.directory, RESUMABLE_FIELDS)
        self.params, self.opt_state, self.step = state["params"], state["opt_state"], meta["step"]
        nnx.update(self.model, self.params)

    # ---- training
    def batch(self, step: int) -> dict[str, jax.Array]:
        ids = batch_ids(self.config.seed, step, self.num_examples, self.config.batch_size)
        prompts, answers = self.examples(ids)
        return shd.shard_batch(make_batch(prompts, answers, self.width, self.pad_id), self.mesh)

    def train(self, log: Callable[[int, dict], None] | None = None,
              stop_after: int | None = None) -> list[dict[str, float]]:
        """Run to `config.num_steps` (or `stop_after` more steps); returns logged metrics.

        Checkpoints every `checkpoint_every` steps and at the end; the model object holds
        the latest parameters afterwards.
        """
        c, history = self.config, []
        end = c.num_steps if stop_after is None else min(c.num_steps, self.step + stop_after)
        t0, tokens = time.perf_counter(), 0
        while self.step < end:
            batch = self.batch(self.step)
            self.params, self.opt_state, metrics = _train_step(
                self.graphdef, self.tx, self.params, self.opt_state, batch)
            self.step += 1
            tokens += c.batch_size * self.width
            if self.step % c.log_every == 0 or self.step == end:
                m = {k: float(v) for k, v in metrics.items()}
                dt = time.perf_counter() - t0
                m.update(step=self.step, seconds=dt, rows_per_s=tokens / self.width / dt)
                history.append(m)
                if log is not None:
                    log(self.step, m)
            if self.ckpt is not None and c.checkpoint_every and self.step % c.checkpoint_every == 0:
                self.save()
        if self.ckpt is not None and self.ckpt.latest_step() != self.step:
            self.save()
        if self.ckpt is not None:
            self.ckpt.wait_until_finished()
        nnx.update(self.model, self.params)
        return history


def load_final_params(model: nnx.Module, config: ml_collections.ConfigDict, workdir: str,
                      mesh: jax.sharding.Mesh | None = None) -> int:
    """Load the latest SFT checkpoint of `workdir` (written with SFT `config`) into `model`
    in place, sharded on `mesh`; returns its step.

    Raises `sera_jax.checkpoint.CheckpointError` when there is none or it does not match.
    """
    ckpt = Checkpointer(os.path.join(workdir, "sft_checkpoints"))
    try:
        if ckpt.latest_step() is None:
            raise CheckpointError(f"no SFT checkpoint in {ckpt.directory}; run the sft stage")
    finally:
        ckpt.close()
    trainer = SFTTrainer(model, config, lambda ids: ([], []), 1, 1, 0, mesh=mesh,
                         workdir=workdir)
    trainer.ckpt.close()
    return trainer.step
