"""The one optimiser builder: a config block (`get_config`) and `make_optimizer`.

    tx = make_optimizer(get_config(learning_rate=1e-5), num_steps=100)

The chain, in order (each part only where it applies):

    clip_by_global_norm(grad_clip)                       grad_clip > 0
    adamw:  adamw(lr(t), b1, b2, eps, weight_decay, mask)   (decoupled decay inside AdamW)
    sgd:    add_decayed_weights(weight_decay, mask) -> sgd(lr(t), momentum)

    lr(t) = learning_rate                                     schedule 'constant'
          = warmup 0 -> learning_rate over warmup_steps, then cosine to 0 at num_steps
                                                              schedule 'cosine'
    mask  = every parameter ('all') or those with ndim > 1 ('kernels': conv / dense
            kernels, not biases or norm scales)

Every configuration the studies used before this module existed gives the same chain (the
same updates bit for bit and the same state pytree; tested against the old chains): the RL
trainer and the lab (AdamW, constant, clip), SFT (AdamW, cosine, clip) and the alignment
study (SGD, cosine, kernel-masked decay, no clip). Equal settings return the same object,
so a jitted step that takes the optimiser as a static argument compiles once per setting.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

import jax
import ml_collections
import optax

from sera_jax.validation import check, is_int, is_number

NAMES = ("adamw", "sgd")
SCHEDULES = ("constant", "cosine")
DECAY_MASKS = ("all", "kernels")

#: The defaults: the spec's "training details common to all" (AdamW (0.9, 0.999), weight
#: decay 0.01, constant learning rate, global-norm clip 1.0).
DEFAULTS: dict[str, Any] = dict(
    name="adamw", learning_rate=1e-4, schedule="constant", warmup_steps=0, b1=0.9, b2=0.999,
    eps=1e-8, weight_decay=0.01, grad_clip=1.0, momentum=0.9, weight_decay_mask="all")


def get_config(**overrides: Any) -> ml_collections.ConfigDict:
    """The optimiser block (`DEFAULTS` with `overrides`); ValueError naming an unknown field."""
    unknown = sorted(set(overrides) - set(DEFAULTS))
    if unknown:
        raise ValueError(f"optimizer config has no field {unknown[0]!r}; fields: "
                         f"{sorted(DEFAULTS)}")
    c = ml_collections.ConfigDict(DEFAULTS)
    c.update(overrides)
    return c


def _settings(config: Mapping[str, Any] | ml_collections.ConfigDict) -> dict[str, Any]:
    """`config`'s fields over `DEFAULTS` (a block without the newer fields means defaults)."""
    given = dict(config.items())
    unknown = sorted(set(given) - set(DEFAULTS))
    if unknown:
        raise ValueError(f"optimizer config has no field {unknown[0]!r}; fields: "
                         f"{sorted(DEFAULTS)}")
    return {**DEFAULTS, **given}


def validate(config: Mapping[str, Any] | ml_collections.ConfigDict,
             num_steps: int | None = None, prefix: str = "optimizer.") -> None:
    """Raise ValueError naming the field (`config.<prefix><field>`) for an invalid setting.

    A cosine schedule needs `num_steps` >= 1 and 0 <= warmup_steps < num_steps; the constant
    schedule has no warmup.
    """
    o = _settings(config)
    c = functools.partial(check, prefix="config." + prefix)
    c(o["name"] in NAMES, "name", o["name"], f"one of {NAMES}")
    c(o["schedule"] in SCHEDULES, "schedule", o["schedule"], f"one of {SCHEDULES}")
    c(o["weight_decay_mask"] in DECAY_MASKS, "weight_decay_mask", o["weight_decay_mask"],
      f"one of {DECAY_MASKS} (kernels = parameters with ndim > 1)")
    for field in ("learning_rate", "weight_decay"):
        c(is_number(o[field]) and o[field] >= 0, field, o[field], "a finite number >= 0")
    c(is_number(o["grad_clip"]) and o["grad_clip"] >= 0, "grad_clip", o["grad_clip"],
      "a finite number >= 0 (0 = no clipping)")
    c(is_number(o["b1"]) and 0 <= o["b1"] < 1, "b1", o["b1"], "[0, 1)")
    c(is_number(o["b2"]) and 0 <= o["b2"] < 1, "b2", o["b2"], "[0, 1)")
    c(is_number(o["eps"]) and o["eps"] > 0, "eps", o["eps"], "a finite number > 0")
    c(is_number(o["momentum"]) and 0 <= o["momentum"] < 1, "momentum", o["momentum"], "[0, 1)")
    w = o["warmup_steps"]
    if o["schedule"] == "constant":
        c(w == 0, "warmup_steps", w, "0 with schedule='constant' (warmup is part of the "
          "'cosine' schedule)")
    else:
        if not (is_int(num_steps) and num_steps >= 1):
            raise ValueError(f"config.{prefix}schedule='cosine' decays to 0 at num_steps, "
                             f"which is {num_steps!r}; pass num_steps >= 1")
        c(is_int(w) and 0 <= w < num_steps, "warmup_steps", w, f"[0, num_steps={num_steps})")


def make_optimizer(config: Mapping[str, Any] | ml_collections.ConfigDict,
                   num_steps: int | None = None) -> optax.GradientTransformation:
    """The optax chain of the module docstring for `config` (fields missing from it take
    `DEFAULTS`); `num_steps` is where the cosine schedule reaches 0 (unused by 'constant').
    Validated first (`validate`); equal settings return the same object."""
    validate(config, num_steps)
    o = _settings(config)
    floats = {k: float(o[k]) for k in ("learning_rate", "b1", "b2", "eps", "weight_decay",
                                       "grad_clip", "momentum")}
    steps = int(num_steps) if o["schedule"] == "cosine" else None
    return _build(o["name"], o["schedule"], int(o["warmup_steps"]), o["weight_decay_mask"],
                  steps, **floats)


def _kernels(params: Any) -> Any:
    """True for the parameters with ndim > 1 (conv / dense kernels)."""
    return jax.tree.map(lambda x: x.ndim > 1, params)


@functools.lru_cache(maxsize=64)
def _build(name: str, schedule: str, warmup_steps: int, weight_decay_mask: str,
           num_steps: int | None, *, learning_rate: float, b1: float, b2: float, eps: float,
           weight_decay: float, grad_clip: float, momentum: float
           ) -> optax.GradientTransformation:
    if schedule == "constant":
        lr = learning_rate
    elif warmup_steps > 0:
        lr = optax.warmup_cosine_decay_schedule(0.0, learning_rate, warmup_steps, num_steps, 0.0)
    else:
        lr = optax.cosine_decay_schedule(learning_rate, num_steps)
    mask = _kernels if weight_decay_mask == "kernels" else None
    if name == "adamw":
        core = optax.adamw(lr, b1=b1, b2=b2, eps=eps, weight_decay=weight_decay, mask=mask)
        # Without clipping, the bare AdamW (its state is what `fused_adamw_step` reads).
        return optax.chain(optax.clip_by_global_norm(grad_clip), core) if grad_clip > 0 else core
    parts = [optax.clip_by_global_norm(grad_clip)] if grad_clip > 0 else []
    parts += [optax.add_decayed_weights(weight_decay, mask=mask),
              optax.sgd(lr, momentum=momentum)]
    return optax.chain(*parts)


__all__ = ["DECAY_MASKS", "DEFAULTS", "NAMES", "SCHEDULES", "get_config", "make_optimizer",
           "validate"]
