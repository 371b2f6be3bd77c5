"""Training steps for the one-step-RL study: supervised CE and the allocated MaxRL loss.

The model is used functionally (`resnet.split_model` / `apply_model`): a `TrainState`
holds parameters, BatchNorm statistics and the optimiser state; steps are pure functions,
jitted once per static configuration. Data parallelism is GSPMD: put the batch on
`sharding.batch_sharding(mesh)` and the state replicated, and `jax.jit` partitions the
step (BatchNorm statistics are reduced over the global batch, so a sharded step equals the
single-device step).

The optimiser is built by `sera_jax.optim` from the config's block (SERA_SPEC §7: SGD with
momentum 0.9, linear warmup then cosine decay, weight decay 1e-4 on conv/dense kernels only).
"""

from __future__ import annotations

import functools
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import optax
from flax import nnx

from sera_jax import metrics
from sera_jax.studies.alignment import gradients as alignment
from sera_jax.studies.alignment.resnet import apply_model, split_model


@flax.struct.dataclass
class TrainState:
    """params (nnx.Param state), batch_stats (BatchNorm running averages), opt_state, step."""

    params: Any
    batch_stats: Any
    opt_state: Any
    step: jax.Array


def init_state(model: nnx.Module, tx: optax.GradientTransformation
               ) -> tuple[nnx.GraphDef, TrainState]:
    """Split `model` and initialise the optimiser: `(graphdef, state)`."""
    graphdef, params, batch_stats = split_model(model)
    return graphdef, TrainState(params=params, batch_stats=batch_stats,
                                opt_state=tx.init(params), step=jnp.zeros((), jnp.int32))


def _batch_metrics(logits: jax.Array, labels: jax.Array) -> dict[str, jax.Array]:
    logp = jax.nn.log_softmax(logits, axis=-1)
    return {
        "ce": -jnp.take_along_axis(logp, labels[:, None], axis=1).mean(),
        "top1": (jnp.argmax(logits, axis=-1) == labels).mean(),
    }


def _apply_update(tx, state: TrainState, grads, new_stats) -> TrainState:
    updates, opt_state = tx.update(grads, state.opt_state, state.params)
    return TrainState(params=optax.apply_updates(state.params, updates), batch_stats=new_stats,
                      opt_state=opt_state, step=state.step + 1)


class Steps:
    """Jitted steps for one model graph and one optimiser.

    * `logits(state, images, train)` — forward only (no state change), [P, C] float32.
    * `ce_step(state, images, labels)` — one supervised step on mean cross-entropy.
    * `rl_step(state, images, labels, counts, weights, key, n0, align)` — one step on the
      allocated MaxRL loss: logits once, rollouts sampled from them, ONE backward pass via
      the logit-space cotangent (`alignment.maxrl_logit_cotangent`). With align=True the
      same forward also yields the exact CE gradient and the step reports `cosine` and
      `norm_ratio` of the RL gradient to it (the published alignment measurement).
    """

    def __init__(self, graphdef: nnx.GraphDef, tx: optax.GradientTransformation):
        self.graphdef = graphdef
        self.tx = tx
        self.logits = jax.jit(self._logits, static_argnames=("train",))
        self.ce_step = jax.jit(self._ce_step)
        self.rl_step = jax.jit(self._rl_step, static_argnames=("n0", "align"))

    def _logits(self, state: TrainState, images: jax.Array, train: bool) -> jax.Array:
        return apply_model(self.graphdef, state.params, state.batch_stats, images,
                           train=train)[0]

    def _ce_step(self, state: TrainState, images: jax.Array, labels: jax.Array):
        def loss(params):
            logits, stats = apply_model(self.graphdef, params, state.batch_stats, images,
                                        train=True)
            ce = optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()
            return ce, (logits, stats)

        (_, (logits, stats)), grads = jax.value_and_grad(loss, has_aux=True)(state.params)
        return _apply_update(self.tx, state, grads, stats), _batch_metrics(logits, labels)

    def _rl_step(self, state: TrainState, images: jax.Array, labels: jax.Array,
                 counts: jax.Array, weights: jax.Array, key: jax.Array, n0: int, align: bool):
        fwd = functools.partial(apply_model, self.graphdef, batch_stats=state.batch_stats,
                                images=images, train=True)
        logits, vjp_fn, stats = jax.vjp(fwd, state.params, has_aux=True)
        cot = alignment.maxrl_logit_cotangent(key, logits, labels, counts, weights, n0=n0)
        grads = vjp_fn(cot)[0]
        out = _batch_metrics(logits, labels)
        if align:
            exact = vjp_fn(alignment.ce_logit_cotangent(logits, labels))[0]
            out["cosine"] = metrics.cosine(grads, exact)
            out["norm_ratio"] = optax.global_norm(grads) / optax.global_norm(exact)
        return _apply_update(self.tx, state, grads, stats), out
