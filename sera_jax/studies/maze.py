r"""The maze study: SFT from scratch, then RL of each method x seed at matched rollout
budgets, a null control, and a paired comparison with confidence intervals (SERA_SPEC §7).

Stages (each resumes or skips finished work, so re-running a killed command continues it):

* `sft`: supervised next-token training on BFS shortest paths (`sera_jax.sft` on the one
  loop), then the SFT policy scored at *every* evaluation point with that point's keys
  (common random numbers: the SFT row of a comparison is never scored with other keys than
  the RL rows), plus once with a second, independent key set (`eval.noise_seed`): the
  noise floor. Each scoring is cached under its fingerprint (`sft/crn/`).
* `rl`: for each method (a name of `sera_jax.methods.METHODS`) and seed, RL from the SFT
  checkpoint on the one loop (`sera_jax.loop`); and, when `compare.null`, the null control
  `null` = uniform with the rewards of every batch permuted within the batch
  (`rl.shuffle_rewards`, same lr and budget). Every method generates exactly `P·N0`
  rollouts per step. At every evaluation point (every `eval.every` steps and the end) the
  policy is scored on the held-out mazes and on the training mazes with the keys of that
  point (`eval_key`); every step's allocation goes to `alloc.jsonl`.
* `eval`: aggregation -> `results/comparison.{md,json}` and figures: pass@k per method and
  seed, paired differences method − `compare.baseline` with bootstrap CIs
  (`sera_jax.studies.compare`), each arm − SFT, the noise floor and the null-control
  check, and the allocator's diagnostics: believed κ (from p̂), realised κ (from the
  training-maze success rates the evaluation measured), mixed-group fraction, share of the
  budget on never-solved mazes, generated rollouts and tokens.
* `all` = sft + rl + eval; `compare` = rl + eval; `regime` = the regime map (a sweep of
  prompts per step x N0 with n_max tied to N0, `config.regime`), sharing the SFT stage.

Workdir layout: `sft/` (checkpoints, train.jsonl, eval.json, crn/, config.json),
`rl/<method>/seed<s>/` (checkpoints, tensorboard, train.jsonl, eval.jsonl, alloc.jsonl,
config.json), `results/`, `regime/<cell>/` (the regime map's cells), `timings.jsonl`.

A run's fingerprint is the task, model, SFT, resolved RL and evaluation config plus the SFT
checkpoint it starts from; resuming under a change to any of them is refused, except the
fields in `RESUMABLE` (how long, how often).
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import ml_collections
import numpy as np
from absl import logging
from flax import nnx

from sera_jax import loop
from sera_jax import methods as methods_lib
from sera_jax import sft as sft_lib
from sera_jax import sharding as shd
from sera_jax.metrics import analytic_pass_at_k, pass_at_k_curve
from sera_jax.models.configs import (
    CACHE_DTYPE_HELP,
    CACHE_DTYPE_NAMES,
    DTYPE_NAMES,
    dtype_from_name,
)
from sera_jax.models.configs import get_config as get_model_config
from sera_jax.models.decoder import Decoder
from sera_jax.records import (
    append_jsonl,
    log_timing,
    read_json,
    read_jsonl,
    write_json,
    write_jsonl,
)
from sera_jax.rl import config as rl_config
from sera_jax.rl import evaluate as eval_lib
from sera_jax.rl import trainer as trainer_lib
from sera_jax.sampling import SamplingConfig
from sera_jax.studies import common
from sera_jax.studies import compare as cmp
from sera_jax.tasks import maze as maze_lib

STAGES = ("sft", "rl", "eval", "all", "compare", "regime")
#: The null-control arm: uniform with rewards permuted within each batch.
NULL = "null"
#: Fingerprint fields a resumed run may change (how long and how often, never what).
RESUMABLE = trainer_lib.RESUMABLE + sft_lib.RESUMABLE + ("eval.every", "eval.batch_size",
                                                         "compare", "regime")
#: Per-split fold of the evaluation key (held-out and training mazes get independent keys).
SPLIT_FOLD = {"eval": 0, "train": 1}
ALLOC_RECORDS = "alloc.jsonl"
#: Precision options (added after the first runs) left out of fingerprints at their default,
#: so earlier runs resume and their cached evaluations stay valid (`loop.trim_fields`):
#: `model.dtype` (compute dtype; parameters and AdamW state stay float32) and
#: `eval.kv_cache_dtype` ('' = the compute dtype); `model.scan_layers` (the layout of the
#: layers' parameters: the same function, equal to float32 tolerance, not bitwise).
MODEL_DEFAULTS = {"dtype": "float32", "scan_layers": False}
EVAL_DEFAULTS = {"kv_cache_dtype": ""}


# ----------------------------------------------------------------------------- building


def build_task(cfg: ml_collections.ConfigDict) -> maze_lib.MazeTask:
    """The maze task of `cfg.task` (splits train / eval / sft)."""
    return maze_lib.task_from_config(cfg.task)


def build_model(cfg: ml_collections.ConfigDict) -> Decoder:
    """A freshly initialised policy: the named preset `cfg.model.preset` with overrides, the
    compute dtype `cfg.model.dtype` (float32 parameters: the master weights of SFT/RL) and
    the layer layout `cfg.model.scan_layers` (stacked layers run by one scan)."""
    overrides = dict(cfg.model.get("overrides", {}) or {})
    overrides["dtype"] = dtype_from_name(cfg.model.get("dtype", "float32"), "model.dtype")
    overrides["scan_layers"] = bool(cfg.model.get("scan_layers", False))  # ml_collections: a bool
    dcfg = get_model_config(cfg.model.preset, **overrides)
    if dcfg.vocab_size != maze_lib.VOCAB_SIZE:
        raise common.StudyError(f"config.model: vocab_size={dcfg.vocab_size}; the maze "
                                f"vocabulary has {maze_lib.VOCAB_SIZE} ids")
    return Decoder(dcfg, rngs=nnx.Rngs(int(cfg.model.seed)))


def make_mesh(cfg: ml_collections.ConfigDict) -> jax.sharding.Mesh:
    return shd.make_mesh(dict(cfg.rl.mesh))


def run_config(cfg: ml_collections.ConfigDict, method: str, seed: int
               ) -> ml_collections.ConfigDict:
    """The resolved trainer config of one run: `cfg.rl` for `method` (user overrides on top of
    the method preset take effect or raise), seed set. `method == NULL` is the null control:
    uniform (the method overrides of `rl.allocation.*` / `rl.estimator` do not apply to it)
    with `shuffle_rewards = True`."""
    base = cfg.rl
    if method == NULL:  # plain uniform MaxRL, whatever overrides the compared methods use
        base = ml_collections.ConfigDict(cfg.rl.to_dict())
        for key in ("name", "mode", "rounding", "threshold", "multiplicity"):
            base.allocation[key] = None
        base.estimator = None
    rl = rl_config.with_method(base, "uniform" if method == NULL else method)
    rl.seed = int(seed)
    if method == NULL:
        rl.shuffle_rewards = True
    return rl


def arms(cfg: ml_collections.ConfigDict, methods: Sequence[str], seeds: Sequence[int]
         ) -> list[tuple[str, list[int]]]:
    """(arm, seeds) of a comparison: every method with `seeds`, then the null control (when
    `compare.null`) with `compare.null_seeds` (empty = `seeds`)."""
    out = [(m, list(seeds)) for m in methods]
    if cfg.compare.null:
        null_seeds = (common.parse_list(cfg.compare.null_seeds, int, "compare.null_seeds")
                      if str(cfg.compare.null_seeds).strip() else list(seeds))
        out.append((NULL, null_seeds))
    return out


def sft_width(task: maze_lib.MazeTask) -> int:
    """Static SFT row length: the prompt plus the longest answer the task can have."""
    return task.max_prompt_len + maze_lib.max_answer_length(task.size)


def eval_sampling(cfg: ml_collections.ConfigDict, task: maze_lib.MazeTask) -> SamplingConfig:
    return SamplingConfig(max_new_tokens=task.max_new_tokens, temperature=cfg.eval.temperature,
                          stop_ids=tuple(task.stop_ids), pad_id=task.pad_id,
                          cache_dtype=cfg.eval.get("kv_cache_dtype", "") or None)


def sft_fingerprint(cfg: ml_collections.ConfigDict) -> dict[str, Any]:
    """What defines the SFT model: task (its splits), model and SFT config."""
    return {"task": cfg.task.to_dict(),
            "model": loop.trim_fields(cfg.model.to_dict(), defaults=MODEL_DEFAULTS),
            "sft": sft_lib.config_fingerprint(cfg.sft)}


def rl_fingerprint(cfg: ml_collections.ConfigDict, rl: ml_collections.ConfigDict,
                   sft_step: int) -> dict[str, Any]:
    """What defines one RL run: the SFT model it starts from, the resolved RL config and the
    evaluation that its curve records."""
    return {**sft_fingerprint(cfg), "start": {"sft_step": int(sft_step)},
            "rl": rl_config.fingerprint(rl),
            "eval": loop.trim_fields(cfg.eval.to_dict(), defaults=EVAL_DEFAULTS)}


def eval_steps(cfg: ml_collections.ConfigDict) -> list[int]:
    """The evaluation points of every run: 0 (the start), every `eval.every` steps, the end."""
    t, every = int(cfg.rl.num_steps), int(cfg.eval.every)
    steps = {0, t} | (set(range(every, t, every)) if every > 0 else set())
    return sorted(steps)


def eval_key(seed: int, step: int, split: str) -> jax.Array:
    """The key of evaluation point `step` on `split`: a function of (seed, step, split) only,
    so every policy scored at a point (every method, seed and the SFT start) sees the same
    random numbers (sample r of maze q uses `fold_in(key, q·n + r)`, `rl.evaluate`)."""
    return jax.random.fold_in(jax.random.fold_in(jax.random.key(int(seed)), int(step)),
                              SPLIT_FOLD[split])


# ----------------------------------------------------------------------------- validation


def validate(cfg: ml_collections.ConfigDict, methods: Sequence[str], seeds: Sequence[int]
             ) -> None:
    """Every field the stages read, checked before any data or model is built."""
    c = common.check
    t = cfg.task
    c(isinstance(t.size, int) and t.size >= 3 and t.size % 2 == 1, "task.size", t.size,
      "an odd integer >= 3")
    c(cfg.model.get("dtype", "float32") in DTYPE_NAMES, "model.dtype", cfg.model.get("dtype"),
      f"one of {DTYPE_NAMES} (the compute dtype; parameters stay float32)")
    for field in ("num_train", "num_eval"):
        c(common.positive_int(t[field]), f"task.{field}", t[field], "an integer >= 1")
    c(isinstance(t.num_sft, int) and t.num_sft >= 0, "task.num_sft", t.num_sft,
      "an integer >= 0")
    c(common.positive_int(t.max_new_tokens) and
      t.max_new_tokens >= maze_lib.max_answer_length(t.size), "task.max_new_tokens",
      t.max_new_tokens, f">= the longest answer of a {t.size}x{t.size} maze "
      f"({maze_lib.max_answer_length(t.size)})")
    try:
        sft_lib.validate(cfg.sft)
    except ValueError as e:
        raise common.StudyError(str(e)) from None
    if cfg.sft.split == "sft":
        c(t.num_sft >= 1, "task.num_sft", t.num_sft, ">= 1 (the SFT split is trained on)")
    c(cfg.rl.method is None, "rl.method", cfg.rl.method,
      "unset: the comparison sets it per run from --methods / config.compare.methods")
    c(NULL not in methods, "methods", NULL, "the null control is config.compare.null, not "
      "a method name")
    for method in list(methods) + ([NULL] if cfg.compare.null else []):
        try:
            rl_config.validate(run_config(cfg, method, 0))
        except ValueError as e:
            raise common.StudyError(f"method {method!r}: {e}") from None
    c(cfg.rl.prompts_per_step <= t.num_train, "rl.prompts_per_step", cfg.rl.prompts_per_step,
      f"<= task.num_train={t.num_train}")
    for seed in seeds:
        c(isinstance(seed, int) and seed >= 0, "compare.seeds", seed, "integers >= 0")
    validate_compare(cfg)
    e = cfg.eval
    for field in ("num_samples", "curve_samples", "num_prompts", "batch_size"):
        c(common.positive_int(e[field]), f"eval.{field}", e[field], "an integer >= 1")
    c(e.num_prompts <= t.num_eval, "eval.num_prompts", e.num_prompts,
      f"<= task.num_eval={t.num_eval}")
    c(isinstance(e.train_prompts, int) and 0 <= e.train_prompts <= t.num_train,
      "eval.train_prompts", e.train_prompts, f"an integer in [0, task.num_train={t.num_train}]"
      " (0 = no training-maze evaluation, so no realised κ)")
    c(isinstance(e.every, int) and e.every >= 0, "eval.every", e.every, ">= 0 (0 = final only)")
    c(isinstance(e.temperature, int | float) and np.isfinite(e.temperature) and
      e.temperature > 0, "eval.temperature", e.temperature, "a finite number > 0")
    c(isinstance(e.seed, int), "eval.seed", e.seed, "an integer")
    c(e.get("kv_cache_dtype", "") in CACHE_DTYPE_NAMES, "eval.kv_cache_dtype",
      e.get("kv_cache_dtype"), CACHE_DTYPE_HELP)
    c(isinstance(e.noise_seed, int) and e.noise_seed != e.seed, "eval.noise_seed",
      e.noise_seed, f"an integer other than eval.seed={e.seed} (the second key set)")


def validate_compare(cfg: ml_collections.ConfigDict) -> None:
    """`compare.*` beyond methods / seeds: baseline, null control, bootstrap."""
    c = common.check
    k = cfg.compare
    c(k.baseline in common.parse_methods(k.methods, "compare.methods"), "compare.baseline",
      k.baseline, f"one of compare.methods={k.methods!r}")
    c(isinstance(k.null, bool), "compare.null", k.null, "True or False")
    if str(k.null_seeds).strip():
        for s in common.parse_list(k.null_seeds, int, "compare.null_seeds"):
            c(s >= 0, "compare.null_seeds", s, "integers >= 0")
    c(common.positive_int(k.bootstrap) and k.bootstrap >= 100, "compare.bootstrap",
      k.bootstrap, "an integer >= 100 (bootstrap resamples)")
    c(isinstance(k.level, float) and 0.5 <= k.level < 1, "compare.level", k.level,
      "a float in [0.5, 1)")
    c(isinstance(k.bootstrap_seed, int), "compare.bootstrap_seed", k.bootstrap_seed,
      "an integer")


def regime_cells(cfg: ml_collections.ConfigDict) -> list[tuple[int, int, int]]:
    """(P, N0, n_max) of every cell of the regime map: `regime.prompts_per_step` x
    `regime.rollouts_per_prompt`, `n_max = min(regime.n_max_factor · N0, regime.n_max_cap)`."""
    r = cfg.regime
    ps = common.parse_list(r.prompts_per_step, int, "regime.prompts_per_step")
    ns = common.parse_list(r.rollouts_per_prompt, int, "regime.rollouts_per_prompt")
    return [(p, n, min(int(r.n_max_factor) * n, int(r.n_max_cap))) for p in ps for n in ns]


def cell_config(cfg: ml_collections.ConfigDict, cell: tuple[int, int, int]
                ) -> ml_collections.ConfigDict:
    """`cfg` with one regime cell's batch shape (P, N0, n_max); no null control."""
    p, n0, n_max = cell
    out = ml_collections.ConfigDict(cfg.to_dict())
    out.rl.prompts_per_step, out.rl.rollouts_per_prompt = p, n0
    out.rl.allocation.n_max = n_max
    out.compare.null = False
    return out


def regime_thresholds(cfg: ml_collections.ConfigDict) -> list[float | None]:
    """The θ axis of the regime map: `regime.thresholds` (absent or empty = one value, None:
    every method keeps its preset θ / the config's override)."""
    given = str(cfg.regime.get("thresholds", "") or "").strip()
    return common.parse_list(given, float, "regime.thresholds") if given else [None]


def uses_threshold(method: str) -> bool:
    """Whether `method`'s preset has an active-set threshold θ (the regime's θ axis varies
    it for these methods only; the others' runs are shared by every θ of a cell)."""
    return "threshold" in methods_lib.get_method(method).options


def default_threshold(cfg: ml_collections.ConfigDict, methods: Sequence[str]) -> float | None:
    """The θ every θ-method of `methods` runs with when the regime does not set one (the
    config's override, else their common preset value; None if they differ). A regime θ
    equal to it reuses the θ-free cell's runs."""
    if cfg.rl.allocation.threshold is not None:
        return float(cfg.rl.allocation.threshold)
    presets = {float(methods_lib.get_method(m).options["threshold"])
               for m in methods if uses_threshold(m)}
    return presets.pop() if len(presets) == 1 else None


def arm_config(ccfg: ml_collections.ConfigDict, method: str, theta: float | None
               ) -> ml_collections.ConfigDict:
    """A regime cell's config for one method at θ (`rl.allocation.threshold = θ` for the
    methods that have one, `ccfg` unchanged for the others)."""
    if theta is None or not uses_threshold(method):
        return ccfg
    out = ml_collections.ConfigDict(ccfg.to_dict())
    out.rl.allocation.threshold = float(theta)
    return out


def validate_regime(cfg: ml_collections.ConfigDict) -> list[tuple[int, int, int]]:
    """The regime fields, and every cell's config as a comparison; returns the cells."""
    c = common.check
    c("regime" in cfg, "regime", None, "a regime section (configs/maze/regime_map.py)")
    r = cfg.regime
    c(common.positive_int(r.n_max_factor), "regime.n_max_factor", r.n_max_factor,
      "an integer >= 1")
    c(common.positive_int(r.n_max_cap), "regime.n_max_cap", r.n_max_cap, "an integer >= 1")
    cells = regime_cells(cfg)
    methods = common.parse_methods(r.methods, "regime.methods")
    seeds = common.parse_list(r.seeds, int, "regime.seeds")
    thetas = regime_thresholds(cfg)
    c(cfg.compare.baseline in methods, "regime.methods", r.methods,
      f"a list with compare.baseline={cfg.compare.baseline!r}")
    c(thetas == [None] or any(uses_threshold(m) for m in methods), "regime.thresholds",
      r.get("thresholds"), "empty: none of regime.methods has an active-set threshold")
    c(all(t is None or 0.0 <= t < 1.0 for t in thetas), "regime.thresholds",
      r.get("thresholds"), "values in [0, 1)")
    for cell in cells:
        for theta in thetas:
            try:
                for m in methods:
                    validate(arm_config(cell_config(cfg, cell), m, theta), [m], seeds)
            except common.StudyError as e:
                at = "" if theta is None else f" θ={theta:g}"
                raise common.StudyError(f"regime cell P={cell[0]} N0={cell[1]} "
                                        f"n_max={cell[2]}{at}: {e}") from None
    return cells


# ----------------------------------------------------------------------------- evaluation


def _score(model: Any, task: maze_lib.MazeTask, cfg: ml_collections.ConfigDict, split: str,
           num_prompts: int, n: int, key: jax.Array, mesh: jax.sharding.Mesh | None
           ) -> dict[str, Any]:
    ids = np.arange(min(int(num_prompts), task.split_size(split)))
    batch = shd.round_up_to_shards(int(cfg.eval.batch_size), mesh)
    res = eval_lib.evaluate(model, task, split, num_samples=int(n),
                            sampling=eval_sampling(cfg, task), key=key, prompt_ids=ids,
                            batch_size=batch, mesh=mesh)
    ks, values = pass_at_k_curve(np.full(ids.size, res.num_samples), res.num_correct)
    return {"num_samples": int(res.num_samples),
            "pass_at_k": {str(int(k)): float(v) for k, v in zip(ks, values)},
            "num_correct": res.num_correct.astype(int).tolist(),
            "maj": next((v for k, v in res.summary.items() if k.startswith("maj@")), None),
            "mean_length": res.summary["mean_length"]}


def evaluate_policy(model: Any, task: maze_lib.MazeTask, cfg: ml_collections.ConfigDict,
                    num_samples: int, step: int, mesh: jax.sharding.Mesh | None,
                    seed: int | None = None) -> dict[str, Any]:
    """Evaluation point `step`: `num_samples` completions per maze at `eval.temperature` on
    the first `eval.num_prompts` held-out mazes and (under `train`) on the first
    `eval.train_prompts` training mazes, with the keys `eval_key(seed, step, split)`
    (`seed` defaults to `eval.seed`). Returns a JSON-able record with the pass@k curves and
    the per-maze correct counts."""
    seed = int(cfg.eval.seed if seed is None else seed)
    t0 = time.perf_counter()
    out = {"step": int(step), "key_seed": seed,
           **_score(model, task, cfg, "eval", cfg.eval.num_prompts, num_samples,
                    eval_key(seed, step, "eval"), mesh)}
    if int(cfg.eval.train_prompts) > 0:
        out["train"] = _score(model, task, cfg, "train", cfg.eval.train_prompts, num_samples,
                              eval_key(seed, step, "train"), mesh)
    out["seconds"] = time.perf_counter() - t0
    return out


def pass1_distribution(num_correct: Sequence[int], num_samples: int) -> dict[str, Any]:
    """Summary of per-maze pass@1 = c/n: mean, quantiles, histogram over fixed bins."""
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
                      keys: Sequence[str] = ("num_prompts", "train_prompts", "temperature")
                      ) -> dict[str, Any]:
    """The evaluation fields `keys` of a cached scoring, plus its KV-cache dtype when set."""
    fields = {k: cfg.eval[k] for k in keys}
    fields["kv_cache_dtype"] = cfg.eval.get("kv_cache_dtype", "")
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
               (0, int(cfg.eval.num_samples), int(cfg.eval.seed))]  # the SFT histogram
    wanted = list(dict.fromkeys(wanted))
    os.makedirs(os.path.join(sft_dir, "crn"), exist_ok=True)
    sft_step = latest_sft_step(sft_dir)
    task, loaded, out = None, {}, {}
    for step, n, seed in wanted:
        path = os.path.join(sft_dir, "crn", f"step{step}_n{n}_keys{seed}.json")

        def compute(step=step, n=n, seed=seed) -> dict[str, Any]:
            nonlocal task
            if "model" not in loaded:
                task = build_task(cfg)
                loaded["model"] = model if model is not None else build_model(cfg)
                if model is None:
                    sft_lib.load_final_params(loaded["model"], cfg.sft, sft_dir, mesh,
                                              fingerprint=sft_fingerprint(cfg))
            return evaluate_policy(loaded["model"], task, cfg, n, step, mesh, seed)

        fp = {**sft_fingerprint(cfg), "sft_step": sft_step, "eval": _eval_fingerprint(cfg),
              "point": [step, n, seed]}
        out[(step, n, seed)] = common.cached_json(path, fp, compute)
    return out


def latest_sft_step(sft_dir: str) -> int | None:
    """The step of the latest SFT checkpoint in `sft_dir` (None when there is none)."""
    from sera_jax.checkpoint import Checkpointer

    with Checkpointer(os.path.join(sft_dir, "checkpoints")) as ckpt:
        return ckpt.latest_step()


# ----------------------------------------------------------------------------- stages


def stage_sft(cfg: ml_collections.ConfigDict, workdir: str, mesh=None) -> dict[str, Any]:
    """Train (or resume / skip) SFT; score it at every evaluation point (`sft_points`);
    `sft/eval.json` summarises the step-0 scoring (cached by the SFT and evaluation
    fingerprint)."""
    task = build_task(cfg)
    mesh = mesh if mesh is not None else make_mesh(cfg)
    sft_dir = os.path.join(workdir, "sft")
    model = build_model(cfg)
    program = sft_lib.SFTProgram(
        model, cfg.sft, lambda ids: task.sft_examples(cfg.sft.split, ids),
        task.split_size(cfg.sft.split), sft_width(task), task.pad_id, mesh=mesh)
    result = sft_lib.train(program, sft_dir, fingerprint=sft_fingerprint(cfg))
    if result.resumed_from != cfg.sft.num_steps:
        log_timing(workdir, "sft_train", result.seconds)
    t0 = time.perf_counter()
    points = sft_points(cfg, sft_dir, mesh, program.model)
    log_timing(workdir, "sft_eval", time.perf_counter() - t0)

    def compute() -> dict[str, Any]:
        curve = points[(0, int(cfg.eval.curve_samples), int(cfg.eval.seed))]
        final = points.get((0, int(cfg.eval.num_samples), int(cfg.eval.seed)), curve)
        out = {"curve": curve, "final": final,
               "pass1_distribution": pass1_distribution(final["num_correct"],
                                                        final["num_samples"])}
        logging.info("SFT model: pass@1 distribution over held-out mazes %s",
                     out["pass1_distribution"])
        return out

    fingerprint = {**sft_fingerprint(cfg), "sft_step": result.step,
                   "eval": _eval_fingerprint(cfg, ("num_samples", "curve_samples",
                                                   "num_prompts", "train_prompts",
                                                   "temperature", "seed"))}
    return common.cached_json(os.path.join(sft_dir, "eval.json"), fingerprint, compute)


def run_dir(workdir: str, method: str, seed: int) -> str:
    return os.path.join(workdir, "rl", method, f"seed{seed}")


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
             stop_after: int | None = None, sft_dir: str | None = None) -> loop.Result:
    """One RL run from the SFT checkpoint on the one loop; resumes from its own checkpoint.

    `method` is a method name or `NULL`; `sft_dir` defaults to `<workdir>/sft`; `stop_after`
    (tests) stops after that many steps of this call, as a kill would.
    """
    task = build_task(cfg)
    mesh = mesh if mesh is not None else make_mesh(cfg)
    rl = run_config(cfg, method, seed)
    out = run_dir(workdir, method, seed)
    sft_dir = sft_dir or os.path.join(workdir, "sft")
    sft_eval_path = os.path.join(sft_dir, "eval.json")
    if not os.path.exists(sft_eval_path):
        raise common.StudyError(f"no SFT evaluation at {sft_eval_path}: run --stage=sft first")
    model = build_model(cfg)
    sft_step = sft_lib.load_final_params(model, cfg.sft, sft_dir, mesh,
                                         fingerprint=sft_fingerprint(cfg))
    sft_eval = read_json(sft_eval_path)
    if sft_eval.get("fingerprint", {}).get("sft_step") != sft_step:
        raise common.StudyError(f"{sft_eval_path} does not evaluate the SFT checkpoint "
                                f"(step {sft_step}); run --stage=sft again")
    trainer = trainer_lib.Trainer(rl, task, model, mesh)
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
        where = {"rollouts": step * trainer.budget, "tokens": counter.tokens}
        if final and cfg.eval.curve_samples != cfg.eval.num_samples:
            # The curve keeps one sample size; the final point is also measured so.
            curve = evaluate_policy(policy, task, cfg, cfg.eval.curve_samples, step, mesh)
            common.append_eval(out, {**curve, **where, "curve": True})
            ev["final_only"] = True
        common.append_eval(out, {**ev, **where})
        logging.info("%s seed %d step %d: held-out pass@k %s", method, seed, step,
                     {k: round(v, 4) for k, v in ev["pass_at_k"].items()})
        return {f"pass@{k}": v for k, v in ev["pass_at_k"].items()}

    result = loop.run(
        program, out, fingerprint=rl_fingerprint(cfg, rl, sft_step), resumable=RESUMABLE,
        schedule=loop.Schedule(num_steps=rl.num_steps, checkpoint_every=rl.checkpoint_every,
                               eval_every=int(cfg.eval.every),
                               max_to_keep=rl.max_checkpoints_to_keep, log_every=rl.log_every,
                               async_checkpoint=bool(rl.get("async_checkpoint", False))),
        hooks=loop.Hooks(on_start=on_start, record=record, evaluate=evaluate,
                         log_keys=("reward_mean", "mixed_fraction", "rollouts_min",
                                   "rollouts_max", "kappa_min", "kappa_mean", "loss",
                                   "tokens_per_s", "step_time")),
        stop_after=stop_after)
    log_timing(workdir, f"rl/{method}/seed{seed}", result.seconds)
    return result


# ----------------------------------------------------------------------------- aggregation


def _final_eval(records: list[dict], num_steps: int, num_samples: int) -> dict | None:
    for r in records:
        if r["step"] == num_steps and r["num_samples"] == num_samples and not r.get("curve"):
            return r
    return None


def _mean_spread(values: Sequence[float]) -> tuple[float, float, float, float]:
    v = np.asarray(values, np.float64)
    return (float(v.mean()), float(v.std(ddof=1)) if v.size > 1 else 0.0, float(v.min()),
            float(v.max()))


def _summary(values: Sequence[float]) -> dict[str, Any]:
    return {**dict(zip(("mean", "std", "min", "max"), _mean_spread(values))),
            "values": [float(v) for v in values]}


def allocation_diagnostics(allocs: list[dict], curve: list[dict], shift: int
                           ) -> dict[str, float | None]:
    """What the allocator believed and what was true, averaged over steps.

    Step t's batch was sampled by the policy of step t − 1; its true per-maze success rate
    is taken from the training-maze evaluation at the latest evaluation point <= t − 1
    (`p = c/n`). Over the active prompts with an estimate: believed κ = κ(p̂_q, N_q),
    realised κ = κ(p_q, N_q), `κ(p, N) = 1 − (1 − p)^(N − shift)`; per step the min and the
    mean, then the mean over steps (`kappa_true_min_solvable`: the min over mazes with
    p > 0, since a maze the policy never solves has κ = 0 whatever its N). Also: the share
    of all generated rollouts spent on mazes never solved by any of the run's training
    rollouts, and the mean fraction of mixed groups.
    """
    points = sorted((r["step"], r["train"]) for r in curve if "train" in r)
    believed_min, believed_mean, true_min, true_mean, solvable_min = [], [], [], [], []
    total, successes, spent = 0, {}, {}
    mixed = []
    for a in allocs:
        ids = np.asarray(a["prompt_ids"])
        counts = np.asarray(a["counts"])
        succ = np.asarray(a["successes"])
        total += int(counts.sum())
        for q, n_q, k_q in zip(ids.tolist(), counts.tolist(), succ.tolist()):
            spent[q] = spent.get(q, 0) + n_q
            successes[q] = successes.get(q, 0) + k_q
        active = counts > 0
        mixed.append(float(np.mean((succ[active] > 0) & (succ[active] < counts[active]))))
        p_hat = np.array([np.nan if p is None else p for p in a["p_hat"]], np.float64)
        seen = active & np.isfinite(p_hat)
        if not seen.any():
            continue
        k_b = analytic_pass_at_k(p_hat[seen], np.maximum(counts[seen] - shift, 0))
        believed_min.append(float(k_b.min()))
        believed_mean.append(float(k_b.mean()))
        before = [tr for s, tr in points if s <= a["step"] - 1]
        if before:
            tr = before[-1]
            c = np.asarray(tr["num_correct"])
            covered = seen & (ids < c.size)
            if covered.any():
                p_true = c[ids[covered]] / tr["num_samples"]
                k_t = analytic_pass_at_k(p_true, np.maximum(counts[covered] - shift, 0))
                true_min.append(float(k_t.min()))
                true_mean.append(float(k_t.mean()))
                if (p_true > 0).any():
                    solvable_min.append(float(k_t[p_true > 0].min()))
    never = sum(spent[q] for q in spent if successes[q] == 0)
    mean = lambda v: float(np.mean(v)) if v else None  # noqa: E731
    return {"kappa_believed_min": mean(believed_min), "kappa_believed_mean": mean(believed_mean),
            "kappa_true_min": mean(true_min), "kappa_true_mean": mean(true_mean),
            "kappa_true_min_solvable": mean(solvable_min),
            "mixed_fraction": mean(mixed),
            "never_solved_share": float(never / total) if total else None,
            "never_solved_mazes": int(sum(successes[q] == 0 for q in successes))}


def aggregate(cfg: ml_collections.ConfigDict, workdir: str, methods: Sequence[str],
              seeds: Sequence[int], sft_dir: str | None = None, mesh=None,
              plots: bool = True, results_dir: str | None = None,
              arm_configs: Mapping[str, ml_collections.ConfigDict] | None = None
              ) -> dict[str, Any]:
    """Collect finished runs -> `results/comparison.{json,md}` and figures; returns the dict.

    `arm_configs` (the regime's θ axis): per-method configs where they differ from `cfg`.

    Spread = sample standard deviation over seeds (and min / max in the JSON). Paired
    differences and CIs: `sera_jax.studies.compare` (the SFT start is scored with the keys
    of the final point, like every RL row). The comparison is `valid` only when the null
    control ran and stays within the noise floor of SFT at every k.
    """
    sft_dir = sft_dir or os.path.join(workdir, "sft")
    results_dir = results_dir or os.path.join(workdir, "results")
    os.makedirs(results_dir, exist_ok=True)
    sft_eval = read_json(os.path.join(sft_dir, "eval.json"))
    num_steps, n = int(cfg.rl.num_steps), int(cfg.eval.num_samples)
    points = sft_points(cfg, sft_dir, mesh)
    sft_final = points[(num_steps, n, int(cfg.eval.seed))]
    sft_noise = points[(num_steps, n, int(cfg.eval.noise_seed))]
    ks = cmp.ks_for(n)
    boot = dict(num_resamples=int(cfg.compare.bootstrap), level=float(cfg.compare.level),
                seed=int(cfg.compare.bootstrap_seed))
    table: dict[str, Any] = {
        "sft": {"pass_at_k": sft_final["pass_at_k"],
                "train_pass_at_k": sft_final.get("train", {}).get("pass_at_k"),
                "pass_at_k_noise_keys": sft_noise["pass_at_k"],
                "pass1_distribution": sft_eval["pass1_distribution"],
                "curve": {str(s): points[(s, int(cfg.eval.curve_samples), int(cfg.eval.seed))]
                          ["pass_at_k"] for s in eval_steps(cfg)}},
        "methods": {}, "num_samples": n, "num_steps": num_steps,
        "num_prompts": {"eval": len(sft_final["num_correct"]),
                        "train": len(sft_final.get("train", {}).get("num_correct", []))},
        "baseline": cfg.compare.baseline,
        "ci_method": (f"paired bootstrap over mazes and seeds: {cfg.compare.bootstrap} "
                      f"resamples, each drawing the seeds and the mazes with replacement (the "
                      f"same mazes for every seed), {100 * cfg.compare.level:.0f} % "
                      f"percentile interval of the mean per-maze pass@k difference; every "
                      f"policy at a point is scored with that point's keys"),
        "noise_floor": {"eval": cmp.noise_floor(sft_final["num_correct"],
                                                sft_noise["num_correct"], n, ks, **boot)}}
    if "train" in sft_final:
        table["noise_floor"]["train"] = cmp.noise_floor(
            sft_final["train"]["num_correct"], sft_noise["train"]["num_correct"], n, ks, **boot)
    curves: dict[str, list[list[dict]]] = {}
    correct: dict[str, dict[int, dict[str, list[int]]]] = {}
    for arm, arm_seeds in arms(cfg, methods, seeds):
        runs = []
        curves[arm], correct[arm] = [], {}
        shift = rl_config.method(run_config((arm_configs or {}).get(arm, cfg), arm, 0)
                                 ).kappa_shift
        for seed in arm_seeds:
            d = run_dir(workdir, arm, seed)
            evals = read_jsonl(os.path.join(d, loop.EVAL_RECORDS))
            final = _final_eval(evals, num_steps, n)
            if final is None:
                logging.warning("%s seed %d has no final evaluation; left out", arm, seed)
                continue
            train = read_jsonl(os.path.join(d, loop.TRAIN_RECORDS))
            curve = [r for r in evals if not r.get("final_only")]
            diag = allocation_diagnostics(read_jsonl(os.path.join(d, ALLOC_RECORDS)), curve,
                                          shift)
            runs.append({"seed": seed, "final": final, "rollouts": final["rollouts"],
                         "tokens": final["tokens"],
                         "reward_mean_last": float(np.mean([r["reward_mean"]
                                                            for r in train[-5:]])), **diag})
            curves[arm].append(curve)
            correct[arm][seed] = {"eval": final["num_correct"],
                                  "train": final.get("train", {}).get("num_correct")}
        if not runs:
            continue
        entry = {"seeds": [r["seed"] for r in runs], "pass_at_k": {}, "train_pass_at_k": {}}
        for k in runs[0]["final"]["pass_at_k"]:
            entry["pass_at_k"][k] = _summary([r["final"]["pass_at_k"][k] for r in runs])
            if "train" in runs[0]["final"]:
                entry["train_pass_at_k"][k] = _summary([r["final"]["train"]["pass_at_k"][k]
                                                        for r in runs])
        for field in ("rollouts", "tokens", "reward_mean_last", "kappa_believed_min",
                      "kappa_believed_mean", "kappa_true_min", "kappa_true_mean",
                      "kappa_true_min_solvable", "mixed_fraction", "never_solved_share",
                      "never_solved_mazes"):
            vals = [r[field] for r in runs]
            entry[field] = _summary(vals) if all(v is not None for v in vals) else None
        table["methods"][arm] = entry

    sft_c = {"eval": sft_final["num_correct"], "train": sft_final.get("train", {}).get(
        "num_correct")}
    table["paired"], table["vs_sft"] = {}, {}
    base = cfg.compare.baseline
    for arm in table["methods"]:
        table["vs_sft"][arm] = {}
        for split in ("eval", "train"):
            if sft_c[split] is None:
                continue
            s_ids = sorted(correct[arm])
            table["vs_sft"][arm][split] = cmp.paired_difference(
                [correct[arm][s][split] for s in s_ids], [sft_c[split]] * len(s_ids), n, ks,
                **boot)
        if arm in (base, NULL) or base not in correct:
            continue
        common_seeds = sorted(set(correct[arm]) & set(correct[base]))
        if not common_seeds:
            continue
        table["paired"][arm] = {"seeds": common_seeds}
        for split in ("eval", "train"):
            if sft_c[split] is None:
                continue
            diff = cmp.paired_difference([correct[arm][s][split] for s in common_seeds],
                                         [correct[base][s][split] for s in common_seeds], n,
                                         ks, **boot)
            floors = table["noise_floor"][split]
            for k, e in diff.items():
                e["floor"] = floors[k]["floor"]
                e["verdict"] = cmp.verdict(e, floors[k]["floor"])
            table["paired"][arm][split] = diff
    null = table["vs_sft"].get(NULL, {}).get("eval")
    if null is None:
        table["null_control"] = {"ran": False}
        table["valid"] = False
    else:
        within = cmp.within_floor(null, table["noise_floor"]["eval"])
        table["null_control"] = {"ran": True, "within_floor": within,
                                 "passes": bool(all(within.values()))}
        table["valid"] = table["null_control"]["passes"]
    write_json(os.path.join(results_dir, "comparison.json"), table)
    md = comparison_markdown(table)
    with open(os.path.join(results_dir, "comparison.md"), "w") as f:
        f.write(md)
    if plots:
        plot_comparison(table, curves, sft_eval, results_dir)
    return table


def _pct(x: float | None, digits: int = 1) -> str:
    return "–" if x is None else f"{100 * x:.{digits}f}"


def comparison_markdown(table: dict[str, Any]) -> str:
    """The pass@k table (percent, mean ± std over seeds) with matched rollouts / tokens, the
    paired differences with CIs and verdicts, the noise floor, the null control and the
    allocator diagnostics."""
    ks = list(table["sft"]["pass_at_k"])
    n_steps = table["num_steps"]
    head = "| method | seeds | " + " | ".join(f"pass@{k}" for k in ks) + \
        " | generated rollouts | generated tokens |"
    lines = [head, "|" + "---|" * (len(ks) + 4)]
    lines.append(f"| SFT (start, step-{n_steps} keys) | – | " + " | ".join(
        _pct(table["sft"]["pass_at_k"][k]) for k in ks) + " | 0 | 0 |")
    for method, e in table["methods"].items():
        cells = [f"{_pct(e['pass_at_k'][k]['mean'])} ± {_pct(e['pass_at_k'][k]['std'])}"
                 if k in e["pass_at_k"] else "–" for k in ks]
        lines.append(f"| {method} | {len(e['seeds'])} | " + " | ".join(cells) +
                     f" | {e['rollouts']['mean']:,.0f} | {e['tokens']['mean']:,.0f} ± "
                     f"{e['tokens']['std']:,.0f} |")
    lines.append("")
    lines.append(f"Held-out mazes ({table['num_prompts']['eval']}), n = "
                 f"{table['num_samples']} samples per maze at the final step ({n_steps} RL "
                 "steps), every row scored with the same keys; mean ± sample std over seeds, "
                 "percent.")
    floor = table["noise_floor"]
    for split in ("eval", "train"):
        if split not in floor:
            continue
        name = "held-out" if split == "eval" else "training"
        lines += ["", f"**Paired differences on {name} mazes** (percentage points, mean "
                  f"[95 % CI]; noise floor = one policy, two key sets):", "",
                  "| comparison | " + " | ".join(f"pass@{k}" for k in ks) + " |",
                  "|" + "---|" * (len(ks) + 1),
                  "| noise floor (SFT, keys A − keys B) | " + " | ".join(
                      f"{_pct(floor[split][k]['diff'])} (±{_pct(floor[split][k]['floor'])})"
                      for k in ks) + " |"]
        for arm, p in table.get("paired", {}).items():
            if split in p:
                lines.append(f"| {arm} − {table['baseline']} ({len(p['seeds'])} seeds) | " +
                             " | ".join(_ci(p[split][k]) + f" {_short(p[split][k]['verdict'])}"
                                        for k in ks) + " |")
        for arm, p in table.get("vs_sft", {}).items():
            if split in p:
                lines.append(f"| {arm} − SFT | " + " | ".join(_ci(p[split][k]) for k in ks) +
                             " |")
    nc = table["null_control"]
    lines.append("")
    if not nc["ran"]:
        lines.append("Null control: **not run** -- the comparison is not a result.")
    else:
        bad = [k for k, ok in nc["within_floor"].items() if not ok]
        lines.append("Null control (uniform, rewards shuffled within each batch): " + (
            "within the noise floor of SFT at every k -- the comparison stands." if nc["passes"]
            else f"**outside the noise floor of SFT at k = {', '.join(bad)}**: optimiser "
            "noise alone moves the policy that far, so the comparison is *not* reported as a "
            "result."))
    lines += ["", "**What the allocator did** (mean over steps, then mean ± std over seeds):",
              "", "| method | κ_min believed | κ_min realised | κ_min realised (p > 0) | "
              "κ_mean believed | κ_mean realised | mixed groups | budget on never-solved "
              "mazes | training reward |", "|---|---|---|---|---|---|---|---|---|"]
    for method, e in table["methods"].items():
        def f(field: str, e: dict = e) -> str:
            v = e.get(field)
            return "–" if v is None else f"{v['mean']:.2f} ± {v['std']:.2f}"

        lines.append(f"| {method} | {f('kappa_believed_min')} | {f('kappa_true_min')} | "
                     f"{f('kappa_true_min_solvable')} | "
                     f"{f('kappa_believed_mean')} | {f('kappa_true_mean')} | "
                     f"{f('mixed_fraction')} | {f('never_solved_share')} | "
                     f"{f('reward_mean_last')} |")
    lines += ["", f"CIs: {table['ci_method']}. A difference is a win or a loss only when its "
              "CI excludes 0 and it exceeds the noise floor; otherwise it is no difference."]
    return "\n".join(lines) + "\n"


def _ci(e: dict[str, float]) -> str:
    return f"{100 * e['mean']:+.1f} [{100 * e['lo']:+.1f}, {100 * e['hi']:+.1f}]"


def _short(verdict: str) -> str:
    return {"better": "▲", "worse": "▼"}.get(verdict, "=")


def plot_comparison(table: dict, curves: dict, sft_eval: dict, results_dir: str) -> list[str]:
    """PNG figures: final pass@k vs k per method; pass@1 / pass@k_max vs training rollouts;
    paired differences vs k with CIs and the noise floor; the SFT model's per-maze pass@1
    histogram. Returns the file paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    colors = {"uniform": "tab:blue", "sera": "tab:red", "grpo": "tab:gray", NULL: "tab:olive"}
    fig, ax = plt.subplots(figsize=(5.5, 4))
    ks = [int(k) for k in table["sft"]["pass_at_k"]]
    ax.plot(ks, [table["sft"]["pass_at_k"][str(k)] for k in ks], "k--", label="SFT start")
    for method, e in table["methods"].items():
        kk = [int(k) for k in e["pass_at_k"]]
        mean = np.array([e["pass_at_k"][str(k)]["mean"] for k in kk])
        lo = np.array([e["pass_at_k"][str(k)]["min"] for k in kk])
        hi = np.array([e["pass_at_k"][str(k)]["max"] for k in kk])
        c = colors.get(method)
        ax.plot(kk, mean, "o-", color=c, label=f"{method} ({len(e['seeds'])} seeds)")
        ax.fill_between(kk, lo, hi, color=c, alpha=0.2)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("k")
    ax.set_ylabel("held-out pass@k")
    ax.set_title("pass@k after RL (band: min-max over seeds)")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    paths.append(os.path.join(results_dir, "pass_at_k.png"))
    fig.savefig(paths[-1], dpi=120)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(5.5, 4))
    floor = table["noise_floor"]["eval"]
    ax.fill_between(ks, [-100 * floor[str(k)]["floor"] for k in ks],
                    [100 * floor[str(k)]["floor"] for k in ks], color="0.85",
                    label="noise floor")
    for arm, p in table.get("paired", {}).items():
        e = p["eval"]
        mean = np.array([100 * e[str(k)]["mean"] for k in ks])
        ax.errorbar(ks, mean, yerr=[mean - [100 * e[str(k)]["lo"] for k in ks],
                                    [100 * e[str(k)]["hi"] for k in ks] - mean],
                    fmt="o-", capsize=3, color=colors.get(arm),
                    label=f"{arm} − {table['baseline']}")
    if NULL in table.get("vs_sft", {}):
        e = table["vs_sft"][NULL]["eval"]
        ax.plot(ks, [100 * e[str(k)]["mean"] for k in ks], "s:", color=colors[NULL],
                label="null − SFT")
    ax.axhline(0, color="k", lw=0.8)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("k")
    ax.set_ylabel("held-out pass@k difference (points)")
    ax.set_title("paired differences, 95 % CI")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    paths.append(os.path.join(results_dir, "paired_differences.png"))
    fig.savefig(paths[-1], dpi=120)
    plt.close(fig)

    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    sft_curve = table["sft"]["curve"]
    kmax = list(sft_curve["0"])[-1]
    budget = next((r["rollouts"] / r["step"] for runs in curves.values() for run in runs
                   for r in run if r["step"] > 0), None)
    for ax, k in zip(axes, ("1", kmax)):
        for method, runs in curves.items():
            if not runs:
                continue
            c = colors.get(method)
            steps = sorted({r["rollouts"] for r in runs[0]})
            ys = np.array([[next((r["pass_at_k"].get(k, np.nan) for r in run
                                  if r["rollouts"] == s), np.nan) for s in steps]
                           for run in runs])
            ax.plot(steps, np.nanmean(ys, 0), "o-", color=c, label=f"{method}")
            ax.fill_between(steps, np.nanmin(ys, 0), np.nanmax(ys, 0), color=c, alpha=0.2)
        if budget:
            ss = sorted(int(s) for s in sft_curve)
            ax.plot([s * budget for s in ss], [sft_curve[str(s)].get(k, np.nan) for s in ss],
                    "k--", label="SFT (same keys)")
        ax.set_xlabel("generated training rollouts")
        ax.set_ylabel(f"held-out pass@{k}")
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle("held-out pass@k over RL training (mean, band min-max over seeds)")
    fig.tight_layout()
    paths.append(os.path.join(results_dir, "training_curves.png"))
    fig.savefig(paths[-1], dpi=120)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(5, 3.5))
    p = np.asarray(sft_eval["final"]["num_correct"]) / sft_eval["final"]["num_samples"]
    ax.hist(p, bins=np.linspace(0, 1, 21), color="tab:purple")
    ax.set_xlabel("per-maze pass@1 of the SFT policy")
    ax.set_ylabel("held-out mazes")
    ax.set_title(f"SFT start: mean pass@1 {p.mean():.2f}")
    fig.tight_layout()
    paths.append(os.path.join(results_dir, "sft_pass1_hist.png"))
    fig.savefig(paths[-1], dpi=120)
    plt.close(fig)
    return paths


# ----------------------------------------------------------------------------- regime map


def cell_name(cell: tuple[int, int, int], theta: float | None = None) -> str:
    return f"P{cell[0]}_N{cell[1]}_nmax{cell[2]}" + ("" if theta is None else f"_theta{theta:g}")


def stage_regime(cfg: ml_collections.ConfigDict, workdir: str, mesh=None) -> dict[str, Any]:
    """The regime map: per cell (P, N0, n_max) the comparison of `regime.methods` with
    `regime.seeds` in `regime/<cell>/` from the shared SFT stage (the cell of the config's
    own shape runs in the workdir itself, so a finished default comparison is reused), then
    `results/regime_map.{json,md,png}`: SERA − baseline at pass@1 and at the largest k with
    CIs, mixed fraction and κ spread per cell."""
    cells = regime_cells(cfg)
    methods = common.parse_methods(cfg.regime.methods, "regime.methods")
    seeds = common.parse_list(cfg.regime.seeds, int, "regime.seeds")
    thetas = regime_thresholds(cfg)
    preset_theta = default_threshold(cfg, methods)
    sft_dir = os.path.join(workdir, "sft")
    own = (int(cfg.rl.prompts_per_step), int(cfg.rl.rollouts_per_prompt),
           int(cfg.rl.allocation.n_max))
    out: dict[str, Any] = {"cells": {}, "methods": methods, "seeds": seeds}
    for cell, theta in [(cell, theta) for cell in cells for theta in thetas]:
        ccfg = cell_config(cfg, cell)
        # Runs of methods without θ live in the θ-free cell (the workdir itself for the
        # config's own shape) and are linked into each θ cell: one run, every θ.
        base_dir = workdir if cell == own else os.path.join(workdir, "regime", cell_name(cell))
        cdir = (base_dir if theta in (None, preset_theta) else
                os.path.join(workdir, "regime", cell_name(cell, theta)))
        configs = {m: arm_config(ccfg, m, theta) for m in methods}
        t0 = time.perf_counter()
        for seed in seeds:
            for method in methods:
                shared = cdir != base_dir and not uses_threshold(method)
                stage_rl(configs[method], base_dir if shared else cdir, method, seed, mesh,
                         sft_dir=sft_dir)
                if shared:
                    _link_run(base_dir, cdir, method, seed)
        table = aggregate(ccfg, cdir, methods, seeds, sft_dir=sft_dir, mesh=mesh, plots=False,
                          results_dir=os.path.join(cdir, "results"), arm_configs=configs)
        log_timing(workdir, f"regime/{cell_name(cell, theta)}", time.perf_counter() - t0)
        out["cells"][cell_name(cell, theta)] = {
            "P": cell[0], "N0": cell[1], "n_max": cell[2], "theta": theta,
            "paired": table["paired"],
            "diagnostics": {m: {f: e.get(f) for f in ("mixed_fraction", "kappa_true_min",
                                                     "kappa_true_mean", "kappa_believed_min",
                                                     "kappa_true_min_solvable",
                                                     "never_solved_share")}
                            for m, e in table["methods"].items()},
            "pass_at_k": {m: {k: v["mean"] for k, v in e["pass_at_k"].items()}
                          for m, e in table["methods"].items()},
            "seconds": time.perf_counter() - t0}
        # After every cell: partial maps.
        write_regime(out, os.path.join(workdir, "results"), regime_output(cfg))
    return out


def _link_run(src_workdir: str, dst_workdir: str, method: str, seed: int) -> None:
    """`dst/rl/<method>/seed<s>` -> the finished run in `src` (a relative symlink)."""
    src, dst = run_dir(src_workdir, method, seed), run_dir(dst_workdir, method, seed)
    if os.path.lexists(dst):
        if os.path.realpath(dst) != os.path.realpath(src):
            raise common.StudyError(f"{dst} exists and is not the shared run {src}; remove "
                                    "it and run --stage=regime again")
        return
    os.makedirs(os.path.dirname(dst), exist_ok=True)
    os.symlink(os.path.relpath(src, os.path.dirname(dst)), dst)


def regime_output(cfg: ml_collections.ConfigDict) -> str:
    """File stem of a regime sweep's results (`regime.output`, default `regime_map`), so a θ
    sweep in the same workdir does not overwrite the P x N0 map."""
    return str(cfg.regime.get("output", "regime_map") or "regime_map")


def write_regime(out: dict[str, Any], results_dir: str, stem: str = "regime_map") -> None:
    """`<stem>.{json,md,png}` of the cells finished so far."""
    os.makedirs(results_dir, exist_ok=True)
    write_json(os.path.join(results_dir, f"{stem}.json"), out)
    with open(os.path.join(results_dir, f"{stem}.md"), "w") as f:
        f.write(regime_markdown(out))
    plot_regime(out, results_dir, stem)


def regime_markdown(out: dict[str, Any]) -> str:
    """One row per (cell, compared method): pass@1 and pass@k_max differences with CIs and
    verdicts; of both arms the mixed fraction, the realised κ_min over solvable mazes and the
    budget share on never-solved mazes."""
    lines = ["| P | N0 | n_max | θ | method | Δ pass@1 [95 % CI] | Δ pass@k_max [95 % CI] | "
             "mixed (base / method) | κ_min realised, solvable mazes (base / method) | budget on "
             "never-solved (base / method) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for cell in out["cells"].values():
        diag = cell["diagnostics"]
        base = next(m for m in out["methods"] if m not in cell["paired"])
        for arm, p in cell["paired"].items():
            e = p["eval"]
            kmax = list(e)[-1]

            def d(m: str, f: str, diag: dict = diag) -> str:
                v = diag.get(m, {}).get(f)
                return "–" if v is None else f"{v['mean']:.2f}"

            theta = cell.get("theta")
            lines.append(f"| {cell['P']} | {cell['N0']} | {cell['n_max']} | "
                         f"{'preset' if theta is None else f'{theta:g}'} | {arm} | "
                         f"{_ci(e['1'])} {_short(e['1']['verdict'])} | k={kmax}: "
                         f"{_ci(e[kmax])} {_short(e[kmax]['verdict'])} | "
                         f"{d(base, 'mixed_fraction')} / {d(arm, 'mixed_fraction')} | "
                         f"{d(base, 'kappa_true_min_solvable')} / "
                         f"{d(arm, 'kappa_true_min_solvable')} | "
                         f"{d(base, 'never_solved_share')} / {d(arm, 'never_solved_share')} |")
    return "\n".join(lines) + "\n"


def plot_regime(out: dict[str, Any], results_dir: str, stem: str = "regime_map"
                ) -> str | None:
    """Heatmaps (rows P, columns N0) of the first compared method − baseline at pass@1 and
    at the largest k, annotated with the mean and the 95 % CI; with a θ axis (cells at more
    than one θ), the differences against θ with their CIs, one line per (P, N0)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cells = list(out["cells"].values())
    if not cells or not cells[0]["paired"]:
        return None
    arm = next(iter(cells[0]["paired"]))
    if len({c.get("theta") for c in cells}) > 1:
        return _plot_thresholds(cells, arm, out["methods"][0], results_dir, stem)
    ps = sorted({c["P"] for c in cells})
    ns = sorted({c["N0"] for c in cells})
    kmax = list(cells[0]["paired"][arm]["eval"])[-1]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for ax, k in zip(axes, ("1", kmax)):
        grid = np.full((len(ps), len(ns)), np.nan)
        text = {}
        for c in cells:
            if arm not in c["paired"]:
                continue
            e = c["paired"][arm]["eval"][k]
            i, j = ps.index(c["P"]), ns.index(c["N0"])
            grid[i, j] = 100 * e["mean"]
            text[i, j] = (f"{100 * e['mean']:+.1f}\n[{100 * e['lo']:+.1f}, "
                          f"{100 * e['hi']:+.1f}]\nn_max {c['n_max']}")
        lim = max(1.0, float(np.nanmax(np.abs(grid)))) if np.isfinite(grid).any() else 1.0
        im = ax.imshow(grid, cmap="RdBu", vmin=-lim, vmax=lim, origin="lower")
        for (i, j), t in text.items():
            ax.text(j, i, t, ha="center", va="center", fontsize=8)
        ax.set_xticks(range(len(ns)), [str(n) for n in ns])
        ax.set_yticks(range(len(ps)), [str(p) for p in ps])
        ax.set_xlabel("N0 (rollouts per prompt; n_max tied)")
        ax.set_ylabel("P (prompts per step)")
        ax.set_title(f"{arm} − {out['methods'][0]}: held-out pass@{k} (points)")
        fig.colorbar(im, ax=ax, shrink=0.8)
    fig.tight_layout()
    path = os.path.join(results_dir, f"{stem}.png")
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def _plot_thresholds(cells: list[dict], arm: str, base: str, results_dir: str, stem: str
                     ) -> str:
    import matplotlib.pyplot as plt

    kmax = list(cells[0]["paired"][arm]["eval"])[-1]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    shapes = sorted({(c["P"], c["N0"], c["n_max"]) for c in cells})
    for ax, k in zip(axes, ("1", kmax)):
        for shape in shapes:
            row = sorted((c for c in cells if (c["P"], c["N0"], c["n_max"]) == shape
                          and arm in c["paired"] and c.get("theta") is not None),
                         key=lambda c: c["theta"])
            if not row:
                continue
            e = [c["paired"][arm]["eval"][k] for c in row]
            mean = np.array([100 * x["mean"] for x in e])
            err = np.array([[100 * (x["mean"] - x["lo"]) for x in e],
                            [100 * (x["hi"] - x["mean"]) for x in e]])
            ax.errorbar([c["theta"] for c in row], mean, yerr=err, marker="o", capsize=3,
                        label=f"P {shape[0]}, N0 {shape[1]}, n_max {shape[2]}")
        ax.axhline(0.0, color="grey", lw=0.8)
        ax.set_xlabel("θ (active-set threshold)")
        ax.set_ylabel("points")
        ax.set_title(f"{arm} − {base}: held-out pass@{k}, 95 % CI")
        ax.legend(fontsize=8)
    fig.tight_layout()
    path = os.path.join(results_dir, f"{stem}.png")
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


# ----------------------------------------------------------------------------- smoke


def smoke(cfg: ml_collections.ConfigDict, steps: int, method: str = "sera") -> dict[str, float]:
    """A few RL steps of `cfg` from a freshly initialised policy on `cfg.rl.mesh` (no SFT,
    no checkpoints): the accelerator smoke test. Returns the first (compile) step time and
    the mean step time, sampling tokens/s and generated tokens of the later steps."""
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


# ----------------------------------------------------------------------------- entry


def run(cfg: ml_collections.ConfigDict, workdir: str, stage: str = "all",
        methods: Sequence[str] | None = None, seeds: Sequence[int] | None = None
        ) -> dict[str, Any] | None:
    """Run one stage (see the module docstring) after validating everything; returns the
    aggregate for the eval stages. `methods` / `seeds` default to `config.compare`."""
    if stage not in STAGES:
        raise common.StudyError(f"stage={stage!r}; choose from {STAGES}")
    methods = common.parse_methods(",".join(methods) if methods is not None
                                   else cfg.compare.methods, "methods")
    seeds = (list(seeds) if seeds is not None
             else common.parse_list(cfg.compare.seeds, int, "compare.seeds"))
    validate(cfg, methods, seeds)
    if stage == "regime":
        validate_regime(cfg)
    workdir = common.prepare_workdir(workdir)
    if stage in ("rl", "eval", "compare") and not os.path.exists(
            os.path.join(workdir, "sft", "eval.json")):
        raise common.StudyError(f"--stage={stage} needs the SFT stage's output in "
                                f"{os.path.join(workdir, 'sft')}: run --stage=sft first")
    trainer_lib.initialize_distributed(cfg.rl)
    logging.info("JAX process %d of %d, %d devices", jax.process_index(), jax.process_count(),
                 jax.device_count())
    t0 = time.perf_counter()
    mesh = make_mesh(cfg)
    table = None
    if stage in ("sft", "all", "regime"):
        stage_sft(cfg, workdir, mesh)
    if stage in ("rl", "all", "compare"):
        plan = arms(cfg, methods, seeds)
        # Seed-major: a killed comparison leaves complete pairs behind.
        for seed in sorted({s for _, ss in plan for s in ss}):
            for arm, arm_seeds in plan:
                if seed in arm_seeds:
                    stage_rl(cfg, workdir, arm, seed, mesh)
    if stage in ("eval", "all", "compare"):
        table = aggregate(cfg, workdir, methods, seeds, mesh=mesh)
        logging.info("\n%s", comparison_markdown(table))
    if stage == "regime":
        table = stage_regime(cfg, workdir, mesh)
        logging.info("\n%s", regime_markdown(table))
    log_timing(workdir, f"stage_{stage}", time.perf_counter() - t0)
    return table
