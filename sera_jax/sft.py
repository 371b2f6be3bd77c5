"""Supervised fine-tuning (next-token prediction) on prompt + answer, loss on answer tokens.

Used by the maze experiment to train the policy from scratch on shortest paths before RL
(SERA_SPEC §7: AdamW 5e-4, β (0.9, 0.95), wd 0.01, cosine schedule, clip 1.0).

    loss(θ) = − Σ_{b,t} m[b,t] log π_θ(y[b,t] | y[b,<t]) / Σ_{b,t} m[b,t]

where the sequence `y` is prompt ‖ answer (right-padded) and the mask `m` is 1 exactly on
the answer tokens (token-mean over the batch's answer tokens).

The step is one `jax.jit` program over the model's `nnx.State`: parameters carry
`NamedSharding`s from `sera_jax.sharding` (the same partition rules as the RL trainer), the
batch is split over the mesh's batch axes, and parameters / optimiser state are donated.
Batches are a pure function of (seed, step), so a resumed run replays the same data.
`SFTProgram` is the step; `train` runs it with the one training loop (`sera_jax.loop`:
checkpoints, records, fingerprint check on resume, finite guard).
"""

from __future__ import annotations

import functools
import math
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

from sera_jax import loop, optim
from sera_jax import sharding as shd
from sera_jax.checkpoint import Checkpointer, CheckpointError
from sera_jax.models.logprobs import token_logprobs


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
    c.async_checkpoint = False  # write checkpoints in the background (same results)
    return c


def config_fingerprint(config: ml_collections.ConfigDict) -> dict[str, Any]:
    """`config` as the dict that identifies an SFT run: `to_dict()` without
    `async_checkpoint` (it never changes results, and runs started before it existed keep
    their fingerprints and cached evaluations)."""
    return loop.trim_fields(config.to_dict(), omit=("async_checkpoint",))


def validate(config: ml_collections.ConfigDict) -> None:
    """Raise ValueError naming the field for an invalid SFT setting."""
    c = config
    num = lambda x: (isinstance(x, int | float) and not isinstance(x, bool)  # noqa: E731
                     and math.isfinite(x))
    whole = lambda x: isinstance(x, int) and not isinstance(x, bool)  # noqa: E731
    checks = [
        (whole(c.seed), "seed", c.seed, "an integer"),
        (whole(c.num_steps) and c.num_steps >= 1, "num_steps", c.num_steps, "an integer >= 1"),
        (whole(c.batch_size) and c.batch_size >= 1, "batch_size", c.batch_size, ">= 1"),
        (num(c.learning_rate) and c.learning_rate >= 0, "learning_rate", c.learning_rate,
         "a finite number >= 0"),
        (whole(c.warmup_steps) and 0 <= c.warmup_steps < c.num_steps, "warmup_steps",
         c.warmup_steps, f"[0, num_steps={c.num_steps})"),
        (num(c.b1) and 0 <= c.b1 < 1, "b1", c.b1, "[0, 1)"),
        (num(c.b2) and 0 <= c.b2 < 1, "b2", c.b2, "[0, 1)"),
        (num(c.weight_decay) and c.weight_decay >= 0, "weight_decay", c.weight_decay,
         "a finite number >= 0"),
        (num(c.grad_clip) and c.grad_clip >= 0, "grad_clip", c.grad_clip, ">= 0 (0 = off)"),
        (whole(c.log_every) and c.log_every >= 1, "log_every", c.log_every, ">= 1"),
        (whole(c.checkpoint_every) and c.checkpoint_every >= 0, "checkpoint_every",
         c.checkpoint_every, ">= 0"),
        (whole(c.max_checkpoints_to_keep) and c.max_checkpoints_to_keep >= 1,
         "max_checkpoints_to_keep", c.max_checkpoints_to_keep, ">= 1"),
        (isinstance(c.get("async_checkpoint", False), bool), "async_checkpoint",
         c.get("async_checkpoint"), "True or False"),
    ]
    for ok, field, value, allowed in checks:
        if not ok:
            raise ValueError(f"sft config.{field}={value!r} is invalid; allowed: {allowed}")


def optimizer_config(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
    """The SFT run's `sera_jax.optim` block: AdamW(b1, b2, wd) on a (warmup +) cosine
    schedule to 0 at `num_steps`, after a global-norm clip. `optim.make_optimizer` returns
    the same object for equal settings, so the jitted step (which takes the optimiser as a
    static argument) compiles once per setting."""
    return optim.get_config(
        name="adamw", learning_rate=float(config.learning_rate), schedule="cosine",
        warmup_steps=int(config.warmup_steps), b1=float(config.b1), b2=float(config.b2),
        weight_decay=float(config.weight_decay), grad_clip=float(config.grad_clip))


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
    """One AdamW step on the SFT loss, applied only when finite (`guarded_update`).
    Module-level jit keyed on the (hashable) graph and optimiser: every program of the same
    model/optimiser reuses one compiled step per mesh. Shardings follow the inputs."""
    def loss_fn(p):
        return sft_loss(nnx.merge(graphdef, p), batch)

    loss, grads = jax.value_and_grad(loss_fn)(params)
    return loop.guarded_update(tx, params, opt_state, loss, grads)


def batch_ids(seed: int, step: int, num_examples: int, batch_size: int) -> np.ndarray:
    """Example ids of SFT step `step`: uniform with replacement, a pure function of
    (seed, step) so a resumed run sees the same batches."""
    return np.random.default_rng([int(seed), int(step)]).integers(0, num_examples, batch_size)


ExamplesFn = Callable[[np.ndarray], tuple[list[np.ndarray], list[np.ndarray]]]


#: Fingerprint fields a resumed SFT run may change: logging and checkpoint cadence only
#: (`num_steps` sets the cosine schedule, so a longer run is a different run).
#: `sft.async_checkpoint` is also left out of `fingerprint`; it stays listed for fingerprints
#: that embed the raw config (tests, older records).
RESUMABLE = ("sft.log_every", "sft.checkpoint_every", "sft.max_checkpoints_to_keep",
             "sft.async_checkpoint")


class SFTProgram:
    """SFT of an NNX decoder as a `sera_jax.loop.Program` (jitted, sharded, exact resume).

    `examples(ids) -> (prompts, answers)` returns token arrays for example ids in
    `[0, num_examples)`; `width` is the static row length (>= longest prompt + answer).
    The state is `{"params", "opt_state"}`; the batch of step s is a function of (seed, s).
    """

    def __init__(self, model: nnx.Module, config: ml_collections.ConfigDict,
                 examples: ExamplesFn, num_examples: int, width: int, pad_id: int,
                 mesh: jax.sharding.Mesh | None = None):
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
        self.tx = optim.make_optimizer(optimizer_config(config), int(config.num_steps))
        self.param_shardings = shd.state_shardings(params, self.mesh)
        # Optimiser moments follow their parameter's sharding; counters are replicated.
        self.opt_shardings = optax.tree_map_params(
            self.tx, lambda _, s: s, jax.eval_shape(self.tx.init, params), self.param_shardings,
            transform_non_params=lambda _: shd.replicated(self.mesh),
            is_leaf=lambda x: isinstance(x, nnx.Variable))
        self._t0, self._rows = None, 0

    def init_state(self) -> dict[str, Any]:
        params = nnx.state(self.model)
        opt_state = jax.jit(self.tx.init, out_shardings=self.opt_shardings)(params)
        return {"params": params, "opt_state": opt_state}

    def abstract_state(self, state: dict[str, Any]) -> dict[str, Any]:
        return state

    def position(self, state: dict[str, Any]) -> dict[str, int]:
        return {}

    def batch(self, step: int) -> dict[str, jax.Array]:
        ids = batch_ids(self.config.seed, step, self.num_examples, self.config.batch_size)
        prompts, answers = self.examples(ids)
        return shd.shard_batch(make_batch(prompts, answers, self.width, self.pad_id), self.mesh)

    def step(self, state: dict[str, Any], step: int) -> tuple[dict[str, Any], dict[str, float]]:
        if self._t0 is None:
            self._t0 = time.perf_counter()
        params, opt_state, metrics = _train_step(
            self.graphdef, self.tx, state["params"], state["opt_state"], self.batch(step))
        self._rows += self.config.batch_size
        m = {k: float(v) for k, v in metrics.items()}
        dt = time.perf_counter() - self._t0
        m.update(seconds=dt, rows_per_s=self._rows / max(dt, 1e-9))
        return {"params": params, "opt_state": opt_state}, m


def train(program: SFTProgram, run_dir: str, *, fingerprint: dict[str, Any] | None = None,
          stop_after: int | None = None) -> loop.Result:
    """Run `program` to `config.num_steps` in `run_dir` with the one loop (resumes; refuses
    a resume under another fingerprint, default `{"sft": config_fingerprint(config)}`); the
    program's model holds the final parameters afterwards."""
    c = program.config
    result = loop.run(
        program, run_dir, fingerprint=fingerprint or {"sft": config_fingerprint(c)},
        resumable=RESUMABLE,
        schedule=loop.Schedule(num_steps=c.num_steps, checkpoint_every=c.checkpoint_every,
                               max_to_keep=c.max_checkpoints_to_keep, log_every=c.log_every,
                               async_checkpoint=bool(c.get("async_checkpoint", False))),
        hooks=loop.Hooks(log_keys=("loss", "grad_norm", "rows_per_s")), stop_after=stop_after)
    nnx.update(program.model, result.state["params"])
    return result


def load_final_params(model: nnx.Module, config: ml_collections.ConfigDict, run_dir: str,
                      mesh: jax.sharding.Mesh | None = None,
                      fingerprint: dict[str, Any] | None = None) -> int:
    """Load the latest SFT checkpoint of `run_dir` into `model` in place, sharded on `mesh`;
    returns its step. With `fingerprint`, the checkpoint must have been written under it.

    Raises `sera_jax.checkpoint.CheckpointError` when there is none or it does not match.
    """
    program = SFTProgram(model, config, lambda ids: ([], []), 1, 1, 0, mesh=mesh)
    with Checkpointer(os.path.join(run_dir, "checkpoints")) as ckpt:
        step = ckpt.latest_step()
        if step is None:
            raise CheckpointError(f"no SFT checkpoint in {ckpt.directory}; run the sft stage")
        if fingerprint is not None:
            loop.check_fingerprint(ckpt.restore_meta(step).get("fingerprint"), fingerprint,
                                   RESUMABLE, ckpt.directory)
        state, _ = ckpt.restore(program.init_state(), step)
    nnx.update(model, state["params"])
    return int(step)
