"""Accelerator smoke test (`smoke`): a few RL steps from a fresh policy, timed.

Not named `smoke.py`: the package exports the function `smoke`, which would shadow it.
"""

from __future__ import annotations

import time

import jax
import ml_collections
import numpy as np

from sera_jax import methods as methods_lib
from sera_jax.rl import trainer as trainer_lib
from sera_jax.studies import common
from sera_jax.studies.paired.config import validate
from sera_jax.studies.paired.spec import (
    build_model,
    build_task,
    make_mesh,
    run_config,
)


def smoke(cfg: ml_collections.ConfigDict, steps: int,
          method: str | methods_lib.Method = "sera") -> dict[str, float]:
    """A few RL steps of `cfg` from a freshly initialised policy on `cfg.rl.mesh` (no SFT,
    no checkpoints): the accelerator smoke test. Returns the first (compile) step time and
    the mean step time, sampling tokens/s and generated tokens of the later steps.

    `steps` >= 1 and `method` (a name of `sera_jax.methods.METHODS` or its preset) are the
    binary's `--steps` / `--method`; errors name those flags.
    """
    if not common.positive_int(steps):
        raise common.StudyError(f"--steps={steps!r}; must be an integer >= 1")
    method = common.method_names([method], "--method")[0]
    validate(cfg, [method], [0])
    task = build_task(cfg)
    mesh = make_mesh(cfg)
    model = build_model(cfg)
    trainer = trainer_lib.Trainer(run_config(cfg, method, 0), task, model, mesh)
    state = trainer.init_state(model)
    times, tps, toks = [], [], []
    for _ in range(int(steps)):
        t0 = time.perf_counter()
        state, m = trainer.step(state)
        jax.block_until_ready(state.params)
        times.append(time.perf_counter() - t0)
        tps.append(m["tokens_per_s"])
        toks.append(m["generated_tokens"])
    later = slice(1, None) if len(times) > 1 else slice(0, None)
    return {"devices": float(jax.device_count()), "budget": float(trainer.budget),
            "first_step_s": times[0], "step_s": float(np.mean(times[later])),
            "sample_tokens_per_s": float(np.mean(tps[later])),
            "generated_tokens_per_step": float(np.mean(toks[later])),
            "train_tokens_per_s": float(np.mean(toks[later]) / np.mean(times[later]))}
