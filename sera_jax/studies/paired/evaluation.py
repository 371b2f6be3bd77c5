"""Evaluation: a policy scored at an evaluation point (pass@k curves, per-prompt correct
counts) and the start scored at every point with that point's keys (cached)."""

from __future__ import annotations

import copy
import os
import time
from collections.abc import Sequence
from typing import Any

import jax
import ml_collections
import numpy as np

from sera_jax import loop
from sera_jax import sharding as shd
from sera_jax.metrics import pass_at_k_curve
from sera_jax.rl import evaluate as eval_lib
from sera_jax.studies import common
from sera_jax.studies.paired.kinds import get_kind
from sera_jax.studies.paired.spec import (
    EVAL_DEFAULTS,
    build_task,
    eval_key,
    eval_sampling,
    eval_steps,
    start_fingerprint,
    test_prompts,
    test_split,
)


def _score(model: Any, task: Any, cfg: ml_collections.ConfigDict, split: str,
           num_prompts: int, n: int, key: jax.Array, mesh: jax.sharding.Mesh | None
           ) -> dict[str, Any]:
    ids = np.arange(min(int(num_prompts), task.split_size(split)))
    batch = shd.round_up_to_shards(int(cfg.eval.batch_size), mesh)
    res = eval_lib.evaluate(model, task, split, num_samples=int(n),
                            sampling=eval_sampling(cfg, task), key=key, prompt_ids=ids,
                            batch_size=batch, mesh=mesh)
    ks, values = pass_at_k_curve(np.full(ids.size, res.num_samples), res.num_correct)
    extra = {}
    if cfg.eval.get("outcomes", False):
        extra = outcome_fields(res.outcomes, res.lengths)
    return {**extra, "num_samples": int(res.num_samples),
            "pass_at_k": {str(int(k)): float(v) for k, v in zip(ks, values)},
            "num_correct": res.num_correct.astype(int).tolist(),
            "maj": next((v for k, v in res.summary.items() if k.startswith("maj@")), None),
            "mean_length": res.summary["mean_length"],
            "truncated_fraction": res.summary.get("truncated_fraction")}


def outcome_fields(outcomes: np.ndarray, lengths: np.ndarray) -> dict[str, Any]:
    """The per-sample record of a scoring (`eval.outcomes`): `outcomes`, one string per
    prompt of its samples' `eval_lib.OUTCOMES` indices ("0013..."), `lengths` (tokens,
    [prompt][sample]) and `outcome_fractions` (each class's share of all samples)."""
    outcomes = np.asarray(outcomes, np.int8)
    return {"outcomes": ["".join(map(str, row)) for row in outcomes.tolist()],
            "lengths": np.asarray(lengths, int).tolist(),
            "outcome_fractions": {name: float((outcomes == i).mean())
                                  for i, name in enumerate(eval_lib.OUTCOMES)}}


def evaluate_policy(model: Any, task: Any, cfg: ml_collections.ConfigDict,
                    num_samples: int, step: int, mesh: jax.sharding.Mesh | None,
                    seed: int | None = None) -> dict[str, Any]:
    """Evaluation point `step`: `num_samples` completions per prompt at `eval.temperature` on
    the first `eval.num_prompts` held-out prompts, (under `train`) on the first
    `eval.train_prompts` training prompts and (under `test`) on the first `eval.test_prompts`
    prompts of the sealed test split, with the keys `eval_key(seed, step, split)` (`seed`
    defaults to `eval.seed`). Returns a JSON-able record with the pass@k curves and the
    per-prompt correct counts."""
    seed = int(cfg.eval.seed if seed is None else seed)
    t0 = time.perf_counter()
    out = {"step": int(step), "key_seed": seed,
           **_score(model, task, cfg, "eval", cfg.eval.num_prompts, num_samples,
                    eval_key(seed, step, "eval"), mesh)}
    if int(cfg.eval.train_prompts) > 0:
        out["train"] = _score(model, task, cfg, "train", cfg.eval.train_prompts, num_samples,
                              eval_key(seed, step, "train"), mesh)
    if test_prompts(cfg) > 0:
        out["test"] = _score(model, task, cfg, "test", test_prompts(cfg), num_samples,
                             eval_key(seed, step, "test"), mesh)
    out["seconds"] = time.perf_counter() - t0
    return out


def pass1_distribution(num_correct: Sequence[int], num_samples: int) -> dict[str, Any]:
    """Summary of per-prompt pass@1 = c/n: mean, quantiles, histogram over fixed bins."""
    p = np.asarray(num_correct, np.float64) / num_samples
    edges = [0.0, 1e-12, 0.1, 0.3, 0.5, 0.7, 0.9, 1.0 - 1e-12, 1.0 + 1e-12]
    labels = ["0", "(0,.1)", "[.1,.3)", "[.3,.5)", "[.5,.7)", "[.7,.9)", "[.9,1)", "1"]
    hist, _ = np.histogram(p, bins=edges)
    return {"mean": float(p.mean()), "std": float(p.std()),
            "quantiles": {q: float(np.quantile(p, float(q))) for q in
                          ("0.1", "0.25", "0.5", "0.75", "0.9")},
            "histogram": dict(zip(labels, hist.astype(int).tolist())),
            "fraction_unsolved": float((p == 0).mean()), "fraction_always": float((p == 1).mean())}


def _eval_fingerprint(cfg: ml_collections.ConfigDict,
                      keys: Sequence[str] = ("num_prompts", "train_prompts", "test_prompts",
                                             "temperature")) -> dict[str, Any]:
    """The evaluation fields `keys` of a cached scoring, plus its KV-cache dtype when set and
    the sealed test split's fields when it is scored (`EVAL_DEFAULTS` trimmed)."""
    fields = {k: cfg.eval.get(k, EVAL_DEFAULTS[k]) if k in EVAL_DEFAULTS else cfg.eval[k]
              for k in keys}
    fields["kv_cache_dtype"] = cfg.eval.get("kv_cache_dtype", "")
    if test_prompts(cfg) > 0:
        fields["test_split"] = test_split(cfg)
    return loop.trim_fields(fields, defaults=EVAL_DEFAULTS)


def sft_points(cfg: ml_collections.ConfigDict, sft_dir: str, mesh=None, model=None
               ) -> dict[tuple[int, int, int], dict[str, Any]]:
    """The SFT policy scored at every evaluation point with that point's keys (curve size;
    final size too at the first and last steps) and at the last step with the noise key set:
    `{(step, n, key_seed): record}`, each cached in `sft/crn/` under the fingerprint of the
    SFT checkpoint and of what it measures (the model is loaded only when one is missing)."""
    t = int(cfg.rl.num_steps)
    wanted = [(s, int(cfg.eval.curve_samples), int(cfg.eval.seed)) for s in eval_steps(cfg)]
    wanted += [(t, int(cfg.eval.num_samples), int(cfg.eval.seed)),
               (t, int(cfg.eval.num_samples), int(cfg.eval.noise_seed)),
               # the noise floor at curve size too (the curve gate reads it)
               (t, int(cfg.eval.curve_samples), int(cfg.eval.noise_seed)),
               (0, int(cfg.eval.num_samples), int(cfg.eval.seed))]  # the SFT histogram
    wanted = list(dict.fromkeys(wanted))
    os.makedirs(os.path.join(sft_dir, "crn"), exist_ok=True)
    sft_step = start_step(cfg, sft_dir)
    task, loaded, out = None, {}, {}
    for step, n, seed in wanted:
        path = os.path.join(sft_dir, "crn", f"step{step}_n{n}_keys{seed}.json")

        def compute(step=step, n=n, seed=seed) -> dict[str, Any]:
            nonlocal task
            if "model" not in loaded:
                task = build_task(cfg)
                loaded["model"] = (model if model is not None
                                   else start_policy(cfg, sft_dir, mesh)[0])
            return evaluate_policy(loaded["model"], task, cfg, n, step, mesh, seed)

        fp = {**start_fingerprint(cfg), "sft_step": sft_step, "eval": _eval_fingerprint(cfg),
              "point": [step, n, seed]}
        out[(step, n, seed)] = common.cached_json(path, fp, compute)
    return out


def start_temperature_rows(cfg: ml_collections.ConfigDict, sft_dir: str, mesh=None,
                           model=None) -> dict[str, dict[str, Any]]:
    """The start at each of `eval.start_temperatures` (issue 49: is a gain learning or a
    sharper sampler?), scored like a final point (`evaluate_policy` at step `rl.num_steps`,
    the `eval.seed` keys, `eval.num_samples` samples; one sample at temperature 0, which is
    greedy: every sample would be the same): `{str(T): record}`, each cached in
    `sft/crn/temperature<T>.json` under the start's and the evaluation's fingerprint.
    Empty when the field is unset."""
    temps = [float(t) for t in cfg.eval.get("start_temperatures", ()) or ()]
    out: dict[str, dict[str, Any]] = {}
    if not temps:
        return out
    os.makedirs(os.path.join(sft_dir, "crn"), exist_ok=True)
    loaded: dict[str, Any] = {}
    for temp in temps:
        tcfg = copy.deepcopy(cfg)
        tcfg.eval.temperature = temp
        n = 1 if temp == 0 else int(cfg.eval.num_samples)

        def compute(tcfg=tcfg, n=n) -> dict[str, Any]:
            if "model" not in loaded:
                loaded["task"] = build_task(cfg)
                loaded["model"] = (model if model is not None
                                   else start_policy(cfg, sft_dir, mesh)[0])
            return evaluate_policy(loaded["model"], loaded["task"], tcfg, n,
                                   int(cfg.rl.num_steps), mesh)

        fp = {**start_fingerprint(cfg), "sft_step": start_step(cfg, sft_dir),
              "eval": _eval_fingerprint(tcfg), "point": [int(cfg.rl.num_steps), n,
                                                         int(cfg.eval.seed)]}
        out[f"{temp:g}"] = common.cached_json(
            os.path.join(sft_dir, "crn", f"temperature{temp:g}.json"), fp, compute)
    return out


def start_policy(cfg: ml_collections.ConfigDict, sft_dir: str, mesh=None
                 ) -> tuple[Any, int]:
    """(the policy RL starts from, its step): its kind's `load_start` (the final SFT
    checkpoint in `sft_dir`, or the pretrained model as loaded at step 0)."""
    return get_kind(cfg).load_start(cfg, sft_dir, mesh)


def start_step(cfg: ml_collections.ConfigDict, sft_dir: str) -> int | None:
    """The start's step (its kind's `start_step`; None when it is not made yet)."""
    return get_kind(cfg).start_step(cfg, sft_dir)
