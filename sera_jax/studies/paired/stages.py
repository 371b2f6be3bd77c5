"""Stages: the start (made by its kind, then scored at every evaluation point) and one RL run of a
method (or the null control) and seed on the one loop, with its allocation records."""

from __future__ import annotations

import os
import time
from typing import Any

import ml_collections
import numpy as np
from absl import logging

from sera_jax import loop
from sera_jax import methods as methods_lib
from sera_jax.records import (
    append_jsonl,
    log_timing,
    read_json,
    read_jsonl,
    write_json,
    write_jsonl,
)
from sera_jax.rl import trainer as trainer_lib
from sera_jax.studies import common
from sera_jax.studies.paired import mechanism
from sera_jax.studies.paired.evaluation import (
    _eval_fingerprint,
    evaluate_policy,
    pass1_distribution,
    sft_points,
    start_policy,
    start_temperature_rows,
)
from sera_jax.studies.paired.kinds import get_kind
from sera_jax.studies.paired.spec import (
    ALLOC_RECORDS,
    RESUMABLE,
    build_task,
    make_mesh,
    rl_fingerprint,
    run_config,
    run_dir,
    start_fingerprint,
)
from sera_jax.studies.paired.validity import sft_validity, validity_line


def stage_sft(cfg: ml_collections.ConfigDict, workdir: str, mesh=None) -> dict[str, Any]:
    """Train (or resume / skip) SFT; score it at every evaluation point (`sft_points`);
    `sft/eval.json` summarises the step-0 scoring (cached by the SFT and evaluation
    fingerprint)."""
    mesh = mesh if mesh is not None else make_mesh(cfg)
    sft_dir = os.path.join(workdir, "sft")
    os.makedirs(sft_dir, exist_ok=True)
    model, sft_step = get_kind(cfg).train_start(cfg, sft_dir, mesh, workdir)
    t0 = time.perf_counter()
    points = sft_points(cfg, sft_dir, mesh, model)
    log_timing(workdir, "sft_eval", time.perf_counter() - t0)

    def compute() -> dict[str, Any]:
        curve = points[(0, int(cfg.eval.curve_samples), int(cfg.eval.seed))]
        final = points.get((0, int(cfg.eval.num_samples), int(cfg.eval.seed)), curve)
        out = {"curve": curve, "final": final,
               "pass1_distribution": pass1_distribution(final["num_correct"],
                                                        final["num_samples"])}
        logging.info("start: pass@1 distribution over held-out prompts %s",
                     out["pass1_distribution"])
        return out

    fingerprint = {**start_fingerprint(cfg), "sft_step": sft_step,
                   "eval": _eval_fingerprint(cfg, ("num_samples", "curve_samples",
                                                   "num_prompts", "train_prompts",
                                                   "test_prompts", "temperature", "seed"))}
    out = common.cached_json(os.path.join(sft_dir, "eval.json"), fingerprint, compute)
    # The blind control beside the start (sft/validity.json; the RL stages' gate).
    validity = sft_validity(cfg, sft_dir, out["final"], sft_step)
    logging.info("%s", validity_line(validity))
    for temp, rec in start_temperature_rows(cfg, sft_dir, mesh, model).items():
        logging.info("start at temperature %s: pass@1 %.2f %%", temp,
                     100 * rec["pass_at_k"]["1"])
    return out


class RecordingProgram(trainer_lib.RLProgram):
    """An `RLProgram` that keeps each step's host rollouts record (for `alloc.jsonl`)."""

    last: Any = None

    def step(self, state: Any, step: int) -> tuple[Any, dict[str, float | None]]:
        state, metrics, self.last = self.trainer.step(state, return_rollouts=True)
        return state, metrics


def alloc_record(step: int, rollouts: Any) -> dict[str, Any]:
    """One step's allocation: prompt ids, p̂ (None = unseen), counts N_q, successes K_q."""
    r = rollouts
    successes = np.bincount(r.segment_ids, weights=r.rewards, minlength=len(r.prompt_ids))
    return {"step": int(step), "prompt_ids": np.asarray(r.prompt_ids).astype(int).tolist(),
            "p_hat": [None if not np.isfinite(p) else float(p) for p in r.p_hat],
            "counts": np.asarray(r.counts).astype(int).tolist(),
            "successes": successes.astype(int).tolist()}


def stage_rl(cfg: ml_collections.ConfigDict, workdir: str, method: str, seed: int, mesh=None,
             stop_after: int | None = None, sft_dir: str | None = None,
             resolved: methods_lib.Method | None = None) -> loop.Result:
    """One RL run from the SFT checkpoint on the one loop; resumes from its own checkpoint.

    `method` is a method name or `NULL` (an arm); `resolved` its `Method` as `validate`
    resolved it (None: resolved here, for callers that did not validate); `sft_dir` defaults
    to `<workdir>/sft`; `stop_after` (tests) stops after that many steps of this call, as a
    kill would.
    """
    task = build_task(cfg)
    mesh = mesh if mesh is not None else make_mesh(cfg)
    rl = run_config(cfg, method, seed)
    out = run_dir(workdir, method, seed)
    sft_dir = sft_dir or os.path.join(workdir, "sft")
    sft_eval_path = os.path.join(sft_dir, "eval.json")
    if not os.path.exists(sft_eval_path):
        raise common.StudyError(f"no SFT evaluation at {sft_eval_path}: run --stage=sft first")
    model, sft_step = start_policy(cfg, sft_dir, mesh)
    sft_eval = read_json(sft_eval_path)
    if sft_eval.get("fingerprint", {}).get("sft_step") != sft_step:
        raise common.StudyError(f"{sft_eval_path} does not evaluate the SFT checkpoint "
                                f"(step {sft_step}); run --stage=sft again")
    trainer = trainer_lib.Trainer(rl, task, model, mesh, method=resolved)
    program = RecordingProgram(trainer, model)
    counter = common.RolloutCounter(out, trainer.budget)
    alloc_path = os.path.join(out, ALLOC_RECORDS)

    def on_start(step: int, state: Any) -> None:
        counter.on_start(step, state)
        write_jsonl(alloc_path, [r for r in read_jsonl(alloc_path) if r["step"] <= step])
        if step == 0 and not read_jsonl(os.path.join(out, loop.EVAL_RECORDS)):
            # The SFT start scored with the step-0 keys (cached; after the resume check).
            start = sft_points(cfg, sft_dir, mesh, model)[
                (0, int(cfg.eval.curve_samples), int(cfg.eval.seed))]
            common.append_eval(out, {**start, "rollouts": 0, "tokens": 0})

    def record(step: int, metrics: dict) -> dict[str, Any]:
        append_jsonl(alloc_path, alloc_record(step, program.last))
        return counter.record(step, metrics)

    def evaluate(step: int, state: Any, final: bool) -> dict[str, float]:
        policy = trainer.model(state)
        n = cfg.eval.num_samples if final else cfg.eval.curve_samples
        ev = evaluate_policy(policy, task, cfg, n, step, mesh)
        ev["mechanism"] = mechanism.measure(cfg, policy, model, task, step, mesh)  # θ, KL
        # Generated rollouts so far (DAPO generates more than the budget B per step).
        where = {"rollouts": counter.rollouts, "tokens": counter.tokens}
        if final and cfg.eval.curve_samples != cfg.eval.num_samples:
            # The curve keeps one sample size; the final point is also measured so.
            curve = evaluate_policy(policy, task, cfg, cfg.eval.curve_samples, step, mesh)
            common.append_eval(out, {**curve, **where, "curve": True})
            ev["final_only"] = True
        common.append_eval(out, {**ev, **where})
        if final and cfg.eval.get("paired_noise", False):
            # The final policy with the noise key set too: the paired noise floor.
            noise = evaluate_policy(policy, task, cfg, cfg.eval.num_samples, step, mesh,
                                    seed=int(cfg.eval.noise_seed))
            common.append_eval(out, {**noise, **where, "noise_keys": True})
        logging.info("%s seed %d step %d: held-out pass@k %s", method, seed, step,
                     {k: round(v, 4) for k, v in ev["pass_at_k"].items()})
        return {f"pass@{k}": v for k, v in ev["pass_at_k"].items()}

    result = loop.run(
        program, out, fingerprint=rl_fingerprint(cfg, rl, sft_step, trainer.method),
        resumable=RESUMABLE,
        schedule=loop.Schedule(num_steps=rl.num_steps, checkpoint_every=rl.checkpoint_every,
                               eval_every=int(cfg.eval.every),
                               max_to_keep=rl.max_checkpoints_to_keep, log_every=rl.log_every,
                               async_checkpoint=bool(rl.get("async_checkpoint", False))),
        hooks=loop.Hooks(on_start=on_start, record=record, evaluate=evaluate,
                         log_keys=("reward_mean", "mixed_fraction", "rollouts_min",
                                   "rollouts_max", "kappa_min", "kappa_mean", "loss",
                                   "grad_norm", "update_norm", "clipped", "tokens_per_s",
                                   "step_time")),
        stop_after=stop_after)
    log_timing(workdir, f"rl/{method}/seed{seed}", result.seconds)
    return result


#: The marker a diverged run leaves in its directory (`run_plan(keep_going=True)`).
DIVERGED = "diverged.json"


def run_plan(cfg: ml_collections.ConfigDict, workdir: str, plan: list[tuple[str, list[int]]],
             mesh=None, *, only: set[int] | None = None, sft_dir: str | None = None,
             resolved: dict[str, methods_lib.Method] | None = None,
             keep_going: bool = False) -> list[dict[str, Any]]:
    """Every (arm, seed) run of `plan` (`spec.rl_plan` / `spec.arms`), seed-major so a
    killed comparison leaves complete pairs behind; `only`: run just these seeds (one
    process per core); `resolved`: each arm's `Method` from `validate`.

    A run whose step is non-finite stops there (`loop.NonFiniteError`: nothing non-finite
    is saved). By default the error propagates. With `keep_going` (a sweep such as the lr
    frontier, where one diverging lr must not stop the others) the run is marked
    `<run dir>/diverged.json` (the error), skipped by later calls, and the plan goes on;
    returns the diverged runs ({arm, seed, error}), earlier ones included."""
    diverged = []
    for seed in sorted({s for _, ss in plan for s in ss}):
        if only is not None and seed not in only:
            continue
        for arm, arm_seeds in plan:
            if seed not in arm_seeds:
                continue
            marker = os.path.join(run_dir(workdir, arm, seed), DIVERGED)
            if keep_going and os.path.exists(marker):
                diverged.append(read_json(marker))
                logging.warning("%s seed %d diverged before (%s): skipped", arm, seed, marker)
                continue
            try:
                stage_rl(cfg, workdir, arm, seed, mesh, sft_dir=sft_dir,
                         resolved=(resolved or {}).get(arm))
            except loop.NonFiniteError as e:
                if not keep_going:
                    raise
                record = {"arm": arm, "seed": int(seed), "error": str(e)}
                os.makedirs(os.path.dirname(marker), exist_ok=True)
                write_json(marker, record)
                diverged.append(record)
                logging.error("%s seed %d diverged: %s", arm, seed, e)
    return diverged
