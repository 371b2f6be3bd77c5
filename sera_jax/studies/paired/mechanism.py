"""The mechanism of the RL updates: how far and how fast each run moves its policy.

Is a method's effect just a smaller (or larger) step? Per step the trainer records
`grad_norm` (‖g‖ before clipping), `update_norm` (‖θ_t − θ_{t−1}‖ of the applied update, 0
when not applied) and `clipped` (‖g‖ > `optimizer.grad_clip`) in `train.jsonl`
(`loop.guarded_update`). At every evaluation point t > 0 of a paired RL run, `measure` adds
to the evaluation record `record["mechanism"]`:

    param_distance     = ‖θ_t − θ_start‖₂                (global over every parameter)
    param_distance_rel = ‖θ_t − θ_start‖₂ / ‖θ_start‖₂
    kl                 = (1/n) Σ_i d_i,   d_i = log π_t(y_i | x_i) − log π_start(y_i | x_i)
    kl_se              = std(d, ddof=1) / √n   (treats the fixed prompts as drawn: it
                         includes between-prompt spread, so it is conservative)
    kl_per_token       = Σ_i d_i / Σ_i |y_i|

with y_i drawn from π_t on the first min(`eval.kl_prompts`, `eval.num_prompts`) held-out
prompts, `eval.kl_samples` completions each (n sequences), and log π(y | x) the sum of the
completion tokens' teacher-forced log-probabilities (stop token included, padding after it
excluded; the trainer's `token_logprobs` path). `kl` is the unbiased Monte Carlo estimate
of KL(π_t ‖ π_start) over completions (a single estimate may be negative). Both policies
are taken at `eval.temperature` without top-p / top-k (softmax(logits / T): a nucleus
would make the KL infinite wherever the two nuclei differ), so at T = 1 it is the KL
between the policies the trainer differentiates. The completions use the key
`eval_key(eval.seed, step, "kl")`: a function of (seed, step) only, the same for every arm
(common random numbers). `eval.kl_prompts = 0` turns the KL off (its fields are None).

Step 0 (the start itself, scored in `stage_rl`'s `on_start`) carries no `mechanism`:
θ_0 = θ_start, so its distance and KL are 0 by definition; summaries list the points t > 0.

`summarise(workdir, arms)` reads the runs' records into per arm, per seed and mean over
seeds: mean update_norm, mean grad_norm, clip rate over all steps and per evaluation window
(t_{j−1}, t_j], param_distance and KL at each evaluation point; `write_summary` writes it
as `results/mechanism.{json,md}` when some run has these fields (runs from before them are
skipped).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import time
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from flax import nnx

from sera_jax import loop
from sera_jax import sharding as shd
from sera_jax.models.logprobs import token_logprobs
from sera_jax.records import read_jsonl, write_json
from sera_jax.rl.evaluate import sample_rows
from sera_jax.sampling import SamplingConfig, left_pad
from sera_jax.studies.paired.spec import (
    EVAL_DEFAULTS,
    EXPLORATORY,
    eval_key,
    eval_sampling,
    run_dir,
)

#: `eval.kl_prompts` / `eval.kl_samples` of a config without them (`spec.EVAL_DEFAULTS`).
KL_PROMPTS, KL_SAMPLES = EVAL_DEFAULTS["kl_prompts"], EVAL_DEFAULTS["kl_samples"]
#: What `summarise` averages per step of `train.jsonl`.
STEP_FIELDS = ("update_norm", "grad_norm", "clipped")
#: What `summarise` reads per evaluation point from `record["mechanism"]`.
POINT_FIELDS = ("param_distance", "param_distance_rel", "kl", "kl_se", "kl_per_token")


# ----------------------------------------------------------------------------- measuring


@dataclasses.dataclass
class Completions:
    """Sampled completions, one row each: prompt row `row_prompt[r]`, tokens [R, L]
    (`pad_id` after the stop token), `mask` [R, L] True on generated tokens, `lengths` [R]."""

    row_prompt: np.ndarray
    tokens: np.ndarray
    mask: np.ndarray
    lengths: np.ndarray


def parameter_distance(params: Any, start_params: Any) -> dict[str, float]:
    """{param_distance: ‖θ − θ_start‖₂, param_distance_rel: ‖θ − θ_start‖₂ / ‖θ_start‖₂,
    param_norm_start: ‖θ_start‖₂}, global over every leaf: per-leaf sums of squares on the
    device (float32), summed in float64 on the host."""
    a, b = jax.tree.leaves(params), jax.tree.leaves(start_params)
    if [x.shape for x in a] != [x.shape for x in b]:
        raise ValueError("parameter_distance: the two parameter trees differ in structure")
    diff, norm = _squared_norms(a, b)
    dist = float(np.sqrt(np.sum(np.asarray([shd.to_host(x) for x in diff], np.float64))))
    ref = float(np.sqrt(np.sum(np.asarray([shd.to_host(x) for x in norm], np.float64))))
    return {"param_distance": dist, "param_distance_rel": dist / ref if ref > 0 else None,
            "param_norm_start": ref}


@jax.jit
def _squared_norms(a: list, b: list) -> tuple[list, list]:
    f32 = jnp.float32
    return ([jnp.sum(jnp.square(x.astype(f32) - y.astype(f32))) for x, y in zip(a, b)],
            [jnp.sum(jnp.square(y.astype(f32))) for y in b])


def sample_completions(policy: nnx.Module, prompts: np.ndarray, prompt_mask: np.ndarray, *,
                       prompt_ids: np.ndarray, num_samples: int, sampling: SamplingConfig,
                       key: jax.Array, batch_size: int, mesh: jax.sharding.Mesh | None = None
                       ) -> Completions:
    """`num_samples` completions from `policy` of each left-padded prompt row ([P, W]),
    prompt-major; sample r of prompt id q uses `fold_in(key, q·n + r)` (as `rl.evaluate`:
    independent of the batching and of the other prompts)."""
    row_prompt, out = sample_rows(policy, prompts, prompt_mask, prompt_ids, num_samples,
                                  sampling, key, batch_size, mesh)
    lengths = np.asarray(out.lengths)
    mask = np.arange(out.tokens.shape[1])[None, :] < lengths[:, None]
    return Completions(row_prompt, np.asarray(out.tokens), mask, lengths)


@functools.partial(jax.jit, static_argnums=(0, 6))
def _sequence_logprobs(graphdef, params, prompts, prompt_mask, tokens, mask, temperature):
    model = nnx.merge(graphdef, params)
    lp = token_logprobs(model, jnp.concatenate([prompts, tokens], axis=1),
                        jnp.concatenate([prompt_mask, mask], axis=1), start=prompts.shape[1],
                        temperature=temperature)
    return jnp.sum(lp, axis=1)  # masked positions are 0


def sequence_logprobs(model: nnx.Module, prompts: np.ndarray, prompt_mask: np.ndarray,
                      completions: Completions, *, temperature: float = 1.0,
                      batch_size: int = 256, mesh: jax.sharding.Mesh | None = None
                      ) -> np.ndarray:
    """float64 [R]: log π(y_r | x_r) = Σ_t mask[r, t] · log softmax(logits / temperature)
    [y_r,t], teacher-forced (`token_logprobs` over prompt + completion, the completion's
    positions only, as the trainer's `rollout_loss`), `batch_size` rows per call (the last
    call padded with copies of the last row: one compiled shape)."""
    c = completions
    total = c.row_prompt.size
    width = shd.round_up_to_shards(min(int(batch_size), total), mesh)
    graphdef, params = nnx.split(model)
    out = []
    for start in range(0, total, width):
        sel = np.minimum(np.arange(start, start + width), total - 1)
        rows = (prompts[c.row_prompt[sel]], prompt_mask[c.row_prompt[sel]], c.tokens[sel],
                c.mask[sel])
        rows = shd.shard_batch(rows, mesh) if mesh is not None else rows
        with jax.set_mesh(mesh) if mesh is not None else contextlib.nullcontext():
            lp = _sequence_logprobs(graphdef, params, *rows, float(temperature))
        out.append(shd.to_host(lp)[: min(width, total - start)])
    return np.concatenate(out).astype(np.float64)


def kl_estimate(logp_policy: np.ndarray, logp_start: np.ndarray, num_tokens: np.ndarray
                ) -> dict[str, float | int | None]:
    """KL(π ‖ π_start) from sequences y_i ~ π: d_i = log π(y_i) − log π_start(y_i);
    kl = mean(d), kl_se = std(d, ddof=1)/√n (None for n = 1), kl_per_token = Σd / Σ|y_i|
    (`num_tokens`: completion tokens per sequence)."""
    d = np.asarray(logp_policy, np.float64) - np.asarray(logp_start, np.float64)
    n, tokens = d.size, int(np.sum(num_tokens))
    if n == 0:
        raise ValueError("kl_estimate: no sequences")
    return {"kl": float(d.mean()),
            "kl_se": float(d.std(ddof=1) / np.sqrt(n)) if n > 1 else None,
            "kl_per_token": float(d.sum() / tokens) if tokens > 0 else None,
            "kl_sequences": int(n), "kl_tokens": tokens}


def policy_kl(policy: nnx.Module, start: nnx.Module, prompts: np.ndarray,
              prompt_mask: np.ndarray, *, prompt_ids: np.ndarray, num_samples: int,
              sampling: SamplingConfig, key: jax.Array, batch_size: int = 256,
              mesh: jax.sharding.Mesh | None = None) -> dict[str, float | int | None]:
    """`kl_estimate` of KL(π ‖ π_start) at `sampling.temperature`: completions drawn from
    `policy` (`sample_completions`; `sampling` should have no top-p / top-k), scored under
    both policies (`sequence_logprobs`)."""
    comp = sample_completions(policy, prompts, prompt_mask, prompt_ids=prompt_ids,
                              num_samples=num_samples, sampling=sampling, key=key,
                              batch_size=batch_size, mesh=mesh)
    kw = dict(temperature=sampling.temperature, batch_size=batch_size, mesh=mesh)
    lp = sequence_logprobs(policy, prompts, prompt_mask, comp, **kw)
    lp_start = sequence_logprobs(start, prompts, prompt_mask, comp, **kw)
    return kl_estimate(lp, lp_start, comp.lengths)


def kl_settings(cfg: ml_collections.ConfigDict) -> tuple[int, int]:
    """(prompts, samples per prompt) of the KL: min(`eval.kl_prompts`, `eval.num_prompts`)
    held-out prompts (defaults `KL_PROMPTS`, `KL_SAMPLES`; 0 prompts = off)."""
    prompts = int(cfg.eval.get("kl_prompts", KL_PROMPTS))
    return min(prompts, int(cfg.eval.num_prompts)), int(cfg.eval.get("kl_samples", KL_SAMPLES))


def kl_sampling(cfg: ml_collections.ConfigDict, task: Any) -> SamplingConfig:
    """The evaluation sampler at `eval.temperature` without top-p / top-k (module
    docstring)."""
    return dataclasses.replace(eval_sampling(cfg, task), top_p=1.0, top_k=0, greedy=False)


def measure(cfg: ml_collections.ConfigDict, policy: nnx.Module, start: nnx.Module,
            task: Any, step: int, mesh: jax.sharding.Mesh | None = None) -> dict[str, Any]:
    """The `mechanism` entry of evaluation point `step` (module docstring): parameter
    distance to the start and KL(π_t ‖ π_start) on held-out prompts (None when
    `eval.kl_prompts` = 0)."""
    t0 = time.perf_counter()
    out: dict[str, Any] = parameter_distance(nnx.state(policy), nnx.state(start))
    num_prompts, samples = kl_settings(cfg)
    if num_prompts > 0:
        ids = np.arange(num_prompts)
        prompts, pmask = left_pad(task.prompt_tokens("eval", ids.tolist()),
                                  int(task.max_prompt_len), int(task.pad_id))
        sampling = kl_sampling(cfg, task)
        out.update(policy_kl(policy, start, prompts, pmask, prompt_ids=ids,
                             num_samples=samples, sampling=sampling,
                             key=eval_key(int(cfg.eval.seed), step, "kl"),
                             batch_size=int(cfg.eval.batch_size), mesh=mesh),
                   kl_prompts=num_prompts, kl_samples=samples,
                   kl_temperature=float(sampling.temperature))
    else:
        out.update(kl=None, kl_se=None, kl_per_token=None)
    out["seconds"] = time.perf_counter() - t0
    return out


# ----------------------------------------------------------------------------- summaries


def _mean(values: Sequence[Any]) -> float | None:
    v = [float(x) for x in values if x is not None]
    return float(np.mean(v)) if v else None


def summarise_run(train: Sequence[Mapping[str, Any]], evals: Sequence[Mapping[str, Any]]
                  ) -> dict[str, Any] | None:
    """One run's summary from its `train.jsonl` and `eval.jsonl` records: the means of
    `STEP_FIELDS` over every step (`clipped`: the clip rate) and, per evaluation point with a
    `mechanism` entry, its `POINT_FIELDS` and the same means over the window
    (previous point, this point]. None when the records predate these fields."""
    if not any("update_norm" in r for r in train):
        return None
    points = {int(r["step"]): r["mechanism"] for r in evals if "mechanism" in r}
    out: dict[str, Any] = {"steps": len(train),
                           **{f"{k}_mean": _mean([r.get(k) for r in train]) for k in STEP_FIELDS}}
    out["clip_rate"] = out.pop("clipped_mean")
    rows, prev = [], 0
    for step in sorted(points):
        window = [r for r in train if prev < int(r["step"]) <= step]
        row = {"step": step, "window": [prev, step],
               **{k: points[step].get(k) for k in POINT_FIELDS},
               **{f"{k}_mean": _mean([r.get(k) for r in window]) for k in STEP_FIELDS}}
        row["clip_rate"] = row.pop("clipped_mean")
        rows.append(row)
        prev = step
    out["points"] = rows
    return out


def mean_over_seeds(runs: Mapping[Any, Mapping[str, Any]]) -> dict[str, Any]:
    """The mean over seeds of every number of `summarise_run` (points: at the steps every
    seed has; None values left out of each mean)."""
    runs = list(runs.values())
    scalar = [k for k, v in runs[0].items() if k != "points" and not isinstance(v, list)]
    out: dict[str, Any] = {k: _mean([r.get(k) for r in runs]) for k in scalar}
    out["seeds"] = len(runs)
    common_steps = set.intersection(*({p["step"] for p in r["points"]} for r in runs))
    rows = []
    for step in sorted(common_steps):
        at = [next(p for p in r["points"] if p["step"] == step) for r in runs]
        row = {"step": step, "window": at[0]["window"]}
        for k in at[0]:
            if k not in ("step", "window"):
                row[k] = _mean([p.get(k) for p in at])
        rows.append(row)
    out["points"] = rows
    return out


def summarise(workdir: str, arms: Sequence[tuple[str, Sequence[int]]]) -> dict[str, Any]:
    """{"arms": {arm: {"seeds": {seed: summarise_run}, "mean": mean_over_seeds}}} over the
    runs of `arms` ((arm, seeds), as `spec.arms`) in `workdir` that have the fields; arms
    without any such run are left out."""
    out: dict[str, Any] = {"arms": {}}
    for arm, seeds in arms:
        per_seed = {}
        for seed in seeds:
            d = run_dir(workdir, arm, int(seed))
            run = summarise_run(read_jsonl(os.path.join(d, loop.TRAIN_RECORDS)),
                                read_jsonl(os.path.join(d, loop.EVAL_RECORDS)))
            if run is not None:
                per_seed[str(int(seed))] = run
        if per_seed:
            out["arms"][arm] = {"seeds": per_seed, "mean": mean_over_seeds(per_seed)}
    return out


def _fmt(x: Any, digits: int = 4) -> str:
    return "–" if x is None else f"{x:.{digits}g}"


def markdown(summary: Mapping[str, Any]) -> str:
    """The summary's tables (means over seeds): one row per arm over all steps, then one row
    per arm and evaluation point."""
    lines = []
    if summary.get("exploratory"):
        lines += [f"**{EXPLORATORY[0].upper()}{EXPLORATORY[1:]}**", ""]
    lines += ["## Update mechanism (means over seeds)", "",
              "| arm | seeds | mean ‖Δθ‖ per step | mean ‖g‖ | clip rate |",
              "|---|---|---|---|---|"]
    arms = summary["arms"]
    for arm, e in arms.items():
        m = e["mean"]
        lines.append(f"| {arm} | {m['seeds']} | {_fmt(m['update_norm_mean'])} | "
                     f"{_fmt(m['grad_norm_mean'])} | {_fmt(m['clip_rate'], 3)} |")
    lines += ["", "| arm | step | ‖θ−θ₀‖ | ‖θ−θ₀‖/‖θ₀‖ | KL(π‖π₀) ± se | KL per token | "
              "mean ‖Δθ‖ in window | clip rate in window |", "|---|---|---|---|---|---|---|---|"]
    for arm, e in arms.items():
        for p in e["mean"]["points"]:
            kl = _fmt(p["kl"]) + ("" if p.get("kl_se") is None else f" ± {_fmt(p['kl_se'], 2)}")
            lines.append(f"| {arm} | {p['step']} | {_fmt(p['param_distance'])} | "
                         f"{_fmt(p['param_distance_rel'])} | {kl} | {_fmt(p['kl_per_token'])} "
                         f"| {_fmt(p['update_norm_mean'])} | {_fmt(p['clip_rate'], 3)} |")
    lines += ["", "‖Δθ‖: the applied update's norm per step; KL on held-out prompts, "
              "sampled from π_t at the evaluation temperature (common keys across arms); "
              "± the mean over seeds of each seed's standard error."]
    return "\n".join(lines) + "\n"


def write_summary(results_dir: str, workdir: str, arms: Sequence[tuple[str, Sequence[int]]],
                  exploratory: bool = False) -> dict[str, Any] | None:
    """`summarise` -> `<results_dir>/mechanism.{json,md}`; None (nothing written) when no
    run has the fields."""
    summary = summarise(workdir, arms)
    if not summary["arms"]:
        return None
    if exploratory:
        summary = {"exploratory": True, **summary}
    write_json(os.path.join(results_dir, "mechanism.json"), summary)
    with open(os.path.join(results_dir, "mechanism.md"), "w") as f:
        f.write(markdown(summary))
    return summary


__all__ = ["KL_PROMPTS", "KL_SAMPLES", "Completions", "kl_estimate", "kl_sampling",
           "kl_settings", "markdown", "mean_over_seeds", "measure", "parameter_distance",
           "policy_kl", "sample_completions", "sequence_logprobs", "summarise",
           "summarise_run", "write_summary"]
