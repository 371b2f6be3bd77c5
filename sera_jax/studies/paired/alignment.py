r"""Gradient alignment on the paired study's maze policy: is SERA's batch gradient closer in
*direction* to the exact likelihood gradient than uniform MaxRL's at the same budget?

The measurement of `sera_jax.studies.alignment` (digits, where the exact gradient is the
cross-entropy's) done on an LM policy, where the exact gradient has no closed form and is
estimated with many samples. For one policy and repetition r (SERA_SPEC §1-§4, §6):

1. a batch: P = `rl.prompts_per_step` training prompts drawn without replacement with key
   `fold_in(fold_in(key(alignment.seed), r), 0)` (the same batch for every policy at r);
2. the reference: N_ref = `alignment.reference_samples` rollouts of every prompt (key
   `fold_in(.., 1)`) and the likelihood gradient of the batch objective estimated as
   `g_ref = (1/P) Σ_q (1/K_q) Σ_{i: r_i = 1} ∇ log π(y_i|q)` (the mean score of the
   successes: MaxRL's conditional estimator, `maxrl_conditional`, at large N, with the
   sequence-sum score). A prompt with no success among its N_ref rollouts (K_q = 0) has no
   estimate: it is *uncovered*, contributes 0 to g_ref, and its count is reported;
3. the estimators at the budget B = P·N0 of training, all with one key (`fold_in(.., 2)`,
   common random numbers): each method of `alignment.methods` through the RL trainer's own
   path -- `Trainer.collect_round` (allocation by `objective.plan_rollouts` from p̂, sampling,
   scoring, the method's advantages and N0/N_q weights) and `Trainer.gradients` -- with p̂
   from `alignment.p_sources`:
   * `history`: the success history SERA would read: a checkpoint's own `TrainState.history`
     (the run's, e.g. uniform's; `alignment.history='auto'`), else (the start, or
     `history='warmup'`) a warm-up of `alignment.warmup_epochs` epochs of the uniform
     trainer's data order from this policy, N0 rollouts a prompt, no update (the history
     of a uniform run that had not moved);
   * `oracle`: p_q = K_q/N_ref from the reference's rollouts, clipped to [tiny, 1) (an
     allocation that knows p as well as the reference does);
   an allocator that ignores p̂ (uniform) is measured once; an allocation equal to an
   earlier one of the repetition reuses its rollouts and gradient (same key: same rows);
4. `cosine(ĝ, g_ref)` and `‖ĝ‖/‖g_ref‖`: *primary* on the covered prompts (the rows of
   uncovered prompts get advantage 0 in ĝ: the reference cannot say where they point), and
   `cosine_all` / `norm_ratio_all` with ĝ as trained (all prompts); an estimator with no
   live row (ĝ = 0) has cosine 0, a repetition whose reference has no success at all has
   every cosine undefined (None: left out of the statistics);
5. the reference's own noise: the cosine of the two halves of its rollouts (ranks < N_ref/2
   and the rest, each its own conditional estimate): a noise ceiling. With independent
   noise of equal size per half, cos(g_ref, exact) ≈ sqrt(2c/(1+c)) for half-cosine c
   (`reference_alignment`); the estimators' cosines are attenuated by about that factor,
   the same for every method, so paired differences keep their sign.

Units: every gradient is `−∇loss` rescaled to the sequence-sum score of the theory,
`(1/(P·N0)) Σ_r w_r A_r ∇ log π(y_r)`: the trainer's `token_mean` loss times
Σ|z_r|/(P·N0) (exact), `seq_mean_token_sum_norm` times L (exact), `sequence_mean` times the
mean length (approximate; said in the output). Cosines need no rescaling.

Statistics over the R repetitions (`sera_jax.studies.compare`): mean and `compare.level`
interval of each cosine and norm ratio, and the paired difference of each method's cosine
minus the baseline's (`compare.baseline`) per repetition (`seed_difference`;
`alignment.ci` = 't' (Student t over repetitions) or 'bootstrap').

Policies: the start (`evaluation.start_policy`, with `alignment.include_start`) and the
checkpoints `alignment.steps` (empty: the `alignment.latest` latest) of the run
`<workdir>/rl/<alignment.run>/seed<alignment.run_seed>` or of `alignment.run_dir`. Each
repetition is cached (`common.cached_json`) under `<workdir>/alignment/<policy>/rep<r>.json`
with the fingerprint of what it measures, so a re-run continues; the results are
`<workdir>/results/alignment.{json,md}`.

Config: the `alignment` block (`DEFAULTS`; configs/maze/cpu.py sets it). It is no part of
any run fingerprint or pre-registration hash (`spec.comparison_fields` reads the arms' RL
configs and `compare` only).
"""

from __future__ import annotations

import dataclasses
import os
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

from sera_jax import history as history_lib
from sera_jax import loop, objective
from sera_jax import methods as methods_lib
from sera_jax.checkpoint import Checkpointer
from sera_jax.metrics import cosine
from sera_jax.records import write_json
from sera_jax.rl import config as rl_config
from sera_jax.rl import trainer as trainer_lib
from sera_jax.rl.data import next_prompt_ids
from sera_jax.rl.state import Rollouts, TrainState
from sera_jax.scaling import kappa
from sera_jax.studies import common
from sera_jax.studies.paired.alignment_report import markdown, reference_alignment, summarise
from sera_jax.studies.paired.config import validate as validate_paired
from sera_jax.studies.paired.evaluation import start_policy, start_step
from sera_jax.studies.paired.spec import (
    RESUMABLE,
    build_model,
    build_task,
    make_mesh,
    rl_fingerprint,
    run_config,
    run_dir,
    start_fingerprint,
)

#: Bump when what a stored repetition holds changes (old files are then recomputed).
UNITS_VERSION = 1
P_SOURCES = ("history", "oracle")
HISTORY_MODES = ("auto", "warmup")
#: The `alignment` block's fields and defaults (a config without a field gets these).
DEFAULTS: dict[str, Any] = {
    "reference_samples": 256, "repetitions": 16, "seed": 0, "methods": ("uniform", "sera"),
    "p_sources": P_SOURCES, "include_start": True, "run": "uniform", "run_seed": 0,
    "run_dir": "", "steps": (), "latest": 2, "history": "auto", "warmup_epochs": 4,
    "sample_rows": 0, "ci": "t"}
#: Fields that choose what is reported or which policies, not what a repetition measures.
_REPORT_ONLY = ("repetitions", "include_start", "run", "run_seed", "run_dir", "steps",
                "latest", "ci", "sample_rows")
_WARMUP_FOLD = 2**30  # fold_in(key(seed), _WARMUP_FOLD): the warm-up's keys


# ----------------------------------------------------------------------------- config


def settings(cfg: ml_collections.ConfigDict) -> dict[str, Any]:
    """The `alignment` block over `DEFAULTS` (an unknown field is refused, naming it)."""
    block = cfg.get("alignment")
    given = loop.canonical(block) if block is not None else {}
    unknown = sorted(set(given) - set(DEFAULTS))
    if unknown:
        raise common.StudyError(f"config.alignment.{unknown[0]} is not a field; fields: "
                                f"{sorted(DEFAULTS)}")
    out = {**DEFAULTS, **given}
    for key in ("methods", "p_sources", "steps"):
        out[key] = tuple(out[key]) if isinstance(out[key], list | tuple) else out[key]
    return out


def validate(cfg: ml_collections.ConfigDict) -> tuple[dict[str, Any],
                                                       dict[str, methods_lib.Method]]:
    """Every field this stage reads, before any model or data: the paired config of the
    measured methods (`paired.config.validate`) and the `alignment` block. Returns the
    settings and each method's `Method`."""
    s, c = settings(cfg), common.check
    methods = common.method_names(s["methods"], "alignment.methods")
    base = cfg.compare.baseline
    c(base in methods, "alignment.methods", s["methods"],
      f"a tuple of method names including compare.baseline={base!r}")
    resolved = validate_paired(cfg, methods, [0])
    for name in methods:
        c(not resolved[name].dynamic_sampling, "alignment.methods", name,
          "methods without DAPO dynamic sampling (one round of P prompts)")
    n_ref = s["reference_samples"]
    c(common.positive_int(n_ref) and n_ref >= 4 and n_ref % 2 == 0,
      "alignment.reference_samples", n_ref, "an even integer >= 4 (two halves)")
    c(common.positive_int(s["repetitions"]) and s["repetitions"] >= 2,
      "alignment.repetitions", s["repetitions"], "an integer >= 2 (an interval needs two)")
    c(isinstance(s["seed"], int) and s["seed"] >= 0, "alignment.seed", s["seed"],
      "an integer >= 0")
    c(isinstance(s["p_sources"], tuple) and s["p_sources"]
      and set(s["p_sources"]) <= set(P_SOURCES), "alignment.p_sources", s["p_sources"],
      f"a non-empty tuple of {P_SOURCES}")
    c(s["history"] in HISTORY_MODES, "alignment.history", s["history"],
      f"one of {HISTORY_MODES}")
    c(common.positive_int(s["warmup_epochs"]), "alignment.warmup_epochs",
      s["warmup_epochs"], "an integer >= 1")
    c(isinstance(s["include_start"], bool), "alignment.include_start", s["include_start"],
      "True or False")
    c(isinstance(s["run"], str) and bool(s["run"]), "alignment.run", s["run"],
      "an arm name (rl/<run>/seed<s>)")
    c(isinstance(s["run_seed"], int) and s["run_seed"] >= 0, "alignment.run_seed",
      s["run_seed"], "an integer >= 0")
    c(isinstance(s["run_dir"], str), "alignment.run_dir", s["run_dir"],
      "a path ('' = <workdir>/rl/<run>/seed<run_seed>)")
    if s["steps"]:
        common.int_list(s["steps"], "alignment.steps", minimum=1)
    c(isinstance(s["latest"], int) and s["latest"] >= 0, "alignment.latest", s["latest"],
      "an integer >= 0 (checkpoints measured when alignment.steps is empty)")
    budget = int(cfg.rl.prompts_per_step) * n_ref
    c(isinstance(s["sample_rows"], int) and s["sample_rows"] >= 0
      and (s["sample_rows"] == 0 or budget % s["sample_rows"] == 0), "alignment.sample_rows",
      s["sample_rows"], f"0 (automatic) or a divisor of P*N_ref={budget}")
    c(s["ci"] in ("t", "bootstrap"), "alignment.ci", s["ci"], "'t' or 'bootstrap'")
    try:  # the reference's trainer config (e.g. rl.micro_batch_size must divide P*N_ref)
        rl_config.validate(reference_config(cfg, s))
    except ValueError as e:
        raise common.StudyError(f"the reference (alignment.reference_samples={n_ref}): {e}"
                                ) from None
    return s, {m: resolved[m] for m in methods}


def reference_config(cfg: ml_collections.ConfigDict, s: Mapping[str, Any]
                     ) -> ml_collections.ConfigDict:
    """The reference's trainer config: the uniform run's, with N0 = N_ref, the conditional
    MaxRL estimator and the sequence-sum loss (`seq_mean_token_sum_norm`), and
    `alignment.sample_rows` rows per sampler call (0: P times the largest divisor of N_ref
    with at most 2048 rows a call)."""
    rl = run_config(cfg, "uniform", 0)
    n_ref, p = int(s["reference_samples"]), int(rl.prompts_per_step)
    rl.rollouts_per_prompt = n_ref
    rl.allocation.n_max = max(int(rl.allocation.n_max), n_ref)
    rl.estimator = "maxrl_conditional"
    rl.aggregation = "seq_mean_token_sum_norm"
    rows = int(s["sample_rows"])
    if not rows:
        rows = p * max(d for d in range(1, n_ref + 1)
                       if n_ref % d == 0 and (p * d <= 2048 or d == 1))
    rl.sampling.batch_size = rows
    return rl


# ----------------------------------------------------------------------------- pieces


def host_params(trainer: trainer_lib.Trainer, params: Any) -> TrainState:
    """A `TrainState` holding only `params` (on the trainer's shardings): what
    `collect_round` and `gradients` read."""
    method = trainer.method
    return TrainState(params=jax.device_put(params, trainer.param_shardings), opt_state=None,
                      history=None, key=None, step=None, epoch=None, cursor=None,
                      **({"alloc_state": method.init_state()} if method.stateful else {}))


def score_units(trainer: trainer_lib.Trainer, rollouts: Rollouts) -> tuple[float, bool]:
    """(s, exact): `−s · trainer.gradients` is the sequence-sum estimator
    (1/(P·N0)) Σ_r w_r A_r ∇ log π(y_r) (module docstring)."""
    agg, b = trainer.config.aggregation, trainer.budget
    if agg == "token_mean":
        return float(np.sum(rollouts.lengths)) / b, True
    if agg == "seq_mean_token_sum_norm":
        return float(trainer.loss_len), True
    return float(np.mean(rollouts.lengths)), False


def gradient(trainer: trainer_lib.Trainer, state: TrainState, rollouts: Rollouts) -> Any:
    """The ascent direction of `rollouts` in score units, through `Trainer.gradients`."""
    with jax.set_mesh(trainer.mesh):
        _, grads = trainer.gradients(state.params, trainer.device_batch(rollouts))
    scale = -score_units(trainer, rollouts)[0]
    return jax.tree.map(lambda g: g * scale, grads)


def with_advantages(rollouts: Rollouts, advantages: np.ndarray) -> Rollouts:
    """A copy of `rollouts` with other advantages (float32 [B])."""
    return dataclasses.replace(rollouts, advantages=np.asarray(advantages, np.float32))


def restrict(rollouts: Rollouts, covered: np.ndarray) -> Rollouts:
    """The rows of uncovered prompts with advantage 0 (they add nothing to the gradient)."""
    keep = np.asarray(covered, bool)[rollouts.segment_ids]
    return with_advantages(rollouts, np.where(keep, rollouts.advantages, 0.0))


def subset(rollouts: Rollouts, lo: int, hi: int, estimator: str) -> Rollouts:
    """Rollouts lo..hi−1 of every prompt of an N-each batch, their advantages from their own
    rewards (`objective.rollout_coefficients`), the other rows 0: through the full batch's
    trainer its gradient is (hi − lo)/N times that subset's own estimate."""
    seg = np.asarray(rollouts.segment_ids)
    p = len(rollouts.counts)
    ranks = np.arange(len(seg)) - np.searchsorted(seg, seg, side="left")
    keep = (ranks >= lo) & (ranks < hi)
    plan = objective.plan_from_counts(np.full(p, hi - lo, np.int32), np.ones(p, np.float32),
                                      p * (hi - lo))
    adv, _ = objective.rollout_coefficients(jnp.asarray(rollouts.rewards[keep]), plan,
                                            estimator)
    out = np.zeros(len(seg), np.float32)
    out[keep] = np.asarray(adv)
    return with_advantages(rollouts, out)


def half(rollouts: Rollouts, which: int, estimator: str) -> Rollouts:
    """Half `which` of an N-each batch (0: ranks < N/2, 1: the rest; `subset`)."""
    n = int(rollouts.counts[0])
    return subset(rollouts, which * n // 2, (which + 1) * n // 2, estimator)


def oracle_history(template: history_lib.SuccessHistory, ids: np.ndarray, p: np.ndarray
                   ) -> history_lib.SuccessHistory:
    """A history whose `lookup` of `ids` is p, clipped to [tiny, nextafter(1, 0)]."""
    lo, hi = np.finfo(np.float32).tiny, np.nextafter(np.float32(1), np.float32(0))
    p = np.clip(np.asarray(p, np.float32), lo, hi)
    return template.replace(p_hat=jnp.asarray(template.p_hat).at[ids].set(p),
                            seen=jnp.asarray(template.seen).at[ids].set(True))


def empty_history(trainer: trainer_lib.Trainer) -> history_lib.SuccessHistory:
    """A fresh history over the trainer's split, with its `history.*` prior and discount."""
    h = trainer.config.history
    return history_lib.SuccessHistory.create(trainer.num_prompts, h.alpha, h.beta, h.gamma)


def warmup_history(trainer: trainer_lib.Trainer, state: TrainState, epochs: int,
                   key: jax.Array) -> history_lib.SuccessHistory:
    """The history a uniform run reading the trainer's data order (seed, epochs, P a step)
    would hold after `epochs` epochs from this policy without updating it: step i samples
    with `fold_in(key, i)`; the last epoch is folded in (`start_epoch`)."""
    h, epoch, cursor = empty_history(trainer), 0, 0
    m, p = trainer.num_prompts, trainer.batch_prompts
    for i in range(-(-epochs * m // p)):
        ids, epoch, cursor, started = next_prompt_ids(int(trainer.config.seed), m, p, epoch,
                                                      cursor)
        for _ in range(started):
            h = history_lib.start_epoch(h)
        r = trainer.collect_round(state, h, ids, epoch, cursor, jax.random.fold_in(key, i))
        h = history_lib.update_from_rollouts(h, jnp.asarray(ids), jnp.asarray(r.segment_ids),
                                             jnp.asarray(r.rewards))
    return history_lib.start_epoch(h)


def key_data(key: jax.Array) -> list[int]:
    """The raw uint32 words of a key (as recorded)."""
    return np.asarray(jax.random.key_data(key)).astype(int).tolist()


def repetition_keys(seed: int, r: int) -> dict[str, jax.Array]:
    """Repetition r's keys: prompts, reference rollouts, estimator rollouts (shared)."""
    k = jax.random.fold_in(jax.random.key(int(seed)), int(r))
    return {name: jax.random.fold_in(k, i)
            for i, name in enumerate(("prompts", "reference", "estimators"))}


def draw_prompts(key: jax.Array, num_prompts: int, p: int) -> np.ndarray:
    """P distinct training prompt ids (ascending)."""
    return np.sort(np.asarray(jax.random.choice(key, num_prompts, (p,), replace=False)))


# ----------------------------------------------------------------------------- measurement


@dataclasses.dataclass
class Bench:
    """The trainers of one measurement: the reference's and one per method (sharing the
    compiled programs of the run shape), on one mesh and model graph."""

    reference: trainer_lib.Trainer
    methods: dict[str, trainer_lib.Trainer]
    uniform: trainer_lib.Trainer
    settings: dict[str, Any]
    model: nnx.Module  # the graph (its parameters are not the measured policy's)

    @classmethod
    def build(cls, cfg: ml_collections.ConfigDict, task: Any, model: nnx.Module, mesh: Any,
              s: Mapping[str, Any], resolved: Mapping[str, methods_lib.Method]) -> Bench:
        ref_cfg = reference_config(cfg, s)
        ref = trainer_lib.Trainer(ref_cfg, task, model, mesh)
        trainers = {m: trainer_lib.Trainer(run_config(cfg, m, 0), task, model, mesh, method=r)
                    for m, r in resolved.items()}
        uniform = trainers.get("uniform") or trainer_lib.Trainer(
            run_config(cfg, "uniform", 0), task, model, mesh)
        return cls(ref, trainers, uniform, dict(s), model)

    def estimators(self) -> list[tuple[str, str, str | None]]:
        """(name, method, p source) of every measured estimator, in order."""
        out = []
        for m, tr in self.methods.items():
            if tr.method.allocator == "uniform":
                out.append((m, m, None))
            else:
                out += [(f"{m}:{src}", m, src) for src in self.settings["p_sources"]]
        return out


def measure_repetition(bench: Bench, params: Any, r: int,
                       history: history_lib.SuccessHistory | None) -> dict[str, Any]:
    """One repetition on the policy `params` (module docstring, steps 1-5): a JSON-able
    record. `history`: the `history` p̂ source (None when `p_sources` lacks it)."""
    t0 = time.perf_counter()
    s, ref_tr = bench.settings, bench.reference
    keys = repetition_keys(s["seed"], r)
    ids = draw_prompts(keys["prompts"], ref_tr.num_prompts, ref_tr.batch_prompts)
    ref_state = host_params(ref_tr, params)
    ref = ref_tr.collect_round(ref_state, empty_history(ref_tr), ids, 0, 0, keys["reference"])
    n_ref = int(s["reference_samples"])
    k = np.bincount(ref.segment_ids, weights=ref.rewards, minlength=len(ids))
    covered, p_ref = k > 0, k / n_ref
    g_ref = gradient(ref_tr, ref_state, ref)
    ref_norm = float(optax.global_norm(g_ref))
    halves = [gradient(ref_tr, ref_state, half(ref, i, ref_tr.method.estimator))
              for i in (0, 1)]
    half_cos = float(cosine(*halves))
    record: dict[str, Any] = {
        "repetition": int(r), "keys": {n: key_data(v) for n, v in keys.items()},
        "prompt_ids": ids.astype(int).tolist(),
        "reference": {"samples": n_ref, "successes": k.astype(int).tolist(),
                      "uncovered": int((~covered).sum()), "norm": ref_norm,
                      "half_cosine": half_cos, "reward_mean": float(ref.rewards.mean()),
                      "mean_length": float(np.mean(ref.lengths))},
        "estimators": {}}
    done: dict[tuple, dict[str, Any]] = {}
    for name, m, src in bench.estimators():
        tr = bench.methods[m]
        state = host_params(tr, params)
        if src == "oracle":
            h = oracle_history(empty_history(tr), ids, p_ref)
        else:
            h = history if history is not None else empty_history(tr)
        roll = tr.collect_round(state, h, ids, 0, 0, keys["estimators"])
        # Same rows and weights give the same gradient only under the same estimator and
        # row keys (two-stage methods key rows q·n_max + j, one-shot ones by rank).
        sig = (np.asarray(roll.counts).tobytes(), np.asarray(roll.prompt_weights).tobytes(),
               tr.method.estimator, bool(tr.method.multiplicity),
               tr.method.two_stage)
        if sig not in done:
            g_all = gradient(tr, state, roll)
            succ = np.bincount(roll.segment_ids, weights=roll.rewards, minlength=len(ids))
            # Restricting changes nothing when no row of an uncovered prompt is live (MaxRL:
            # unless the estimator saw a success there).
            live_uncovered = (roll.live & ~covered[roll.segment_ids]).any()
            g_cov = gradient(tr, state, restrict(roll, covered)) if live_uncovered else g_all
            counts = np.asarray(roll.counts)
            seen = (counts > 0) & covered
            kap = np.asarray(kappa(jnp.asarray(np.clip(p_ref, 0.0, 1.0), jnp.float32),
                                   jnp.asarray(counts), tr.kappa_shift))[seen]
            done[sig] = {  # undefined (None) without a reference direction
                "cosine": float(cosine(g_cov, g_ref)) if ref_norm else None,
                "norm_ratio": float(optax.global_norm(g_cov)) / ref_norm if ref_norm else None,
                "cosine_all": float(cosine(g_all, g_ref)) if ref_norm else None,
                "norm_ratio_all": (float(optax.global_norm(g_all)) / ref_norm if ref_norm
                                   else None),
                "counts": counts.astype(int).tolist(),
                "successes": succ.astype(int).tolist(),
                "active": int((counts > 0).sum()),
                "uncovered_successes": int(succ[~covered].sum()),
                "kappa_min": float(kap.min()) if kap.size else None,
                "kappa_mean": float(kap.mean()) if kap.size else None,
                "units_exact": score_units(tr, roll)[1]}
        record["estimators"][name] = {"method": m, "p_source": src, **done[sig]}
    record["seconds"] = time.perf_counter() - t0
    return record


# ----------------------------------------------------------------------------- policies


@dataclasses.dataclass
class Policy:
    """A measured policy: its name (a directory name), where it comes from and a loader of
    (params, its stored history or None)."""

    name: str
    identity: dict[str, Any]
    load: Any  # () -> (params, history | None)


def policies(cfg: ml_collections.ConfigDict, workdir: str, s: Mapping[str, Any],
             bench_of: Any, mesh: Any) -> list[Policy]:
    """The start (with `include_start`) and the chosen checkpoints of the run (module
    docstring). `bench_of()` gives the `Bench` (built on first use)."""
    sft_dir = os.path.join(workdir, "sft")
    sft_step = start_step(cfg, sft_dir)
    out = []
    if s["include_start"]:
        if sft_step is None:
            raise common.StudyError(f"no start in {sft_dir}: run --stage=sft first (or set "
                                    "--config.alignment.include_start=False)")

        def load_start():
            model, _ = start_policy(cfg, sft_dir, mesh)
            return nnx.state(model), None

        out.append(Policy("start", {"source": "start", "sft_step": sft_step}, load_start))
    own = not s["run_dir"]
    rdir = run_dir(workdir, s["run"], s["run_seed"]) if own else s["run_dir"]
    ckpt_dir = os.path.join(rdir, "checkpoints")
    steps: list[int] = []
    if os.path.isdir(ckpt_dir):
        with Checkpointer(ckpt_dir) as ck:
            available = ck.all_steps()
            metas = {t: ck.restore_meta(t) for t in available}
        latest = available[-int(s["latest"]):] if s["latest"] else []
        wanted = list(s["steps"]) or latest
        missing = [t for t in wanted if t not in available]
        if missing:
            raise common.StudyError(f"alignment.steps={list(s['steps'])}: no checkpoint "
                                    f"{missing} in {ckpt_dir} (there: {available})")
        steps = wanted
    elif s["steps"] or not own:
        raise common.StudyError(f"no checkpoints in {ckpt_dir} (alignment.run_dir / "
                                "alignment.run, alignment.run_seed)")
    else:
        logging.info("alignment: no run at %s; measuring the start only", rdir)
    label = (f"{s['run']}_seed{s['run_seed']}" if own
             else os.path.basename(os.path.normpath(rdir)))
    for t in steps:
        stored = metas[t].get("fingerprint")
        if own:  # the workdir's run: it must be this config's (its start included)
            if sft_step is None:
                raise common.StudyError(f"no start in {sft_dir} to check {rdir} against")
            rl = run_config(cfg, s["run"], s["run_seed"])
            loop.check_fingerprint(stored, rl_fingerprint(cfg, rl, sft_step), RESUMABLE,
                                   ckpt_dir)

        def load(t=t):
            tr = bench_of().uniform
            target = tr.abstract_state(tr.init_state(bench_of().model))
            with Checkpointer(ckpt_dir) as ck:
                state, _ = ck.restore(target, t)
            return state.params, state.history

        out.append(Policy(f"{label}_step{t}", {"source": "checkpoint", "run_dir": rdir,
                                                "step": int(t), "run_fingerprint": stored},
                          load))
    return out


def policy_fingerprint(cfg: ml_collections.ConfigDict, s: Mapping[str, Any],
                       resolved: Mapping[str, methods_lib.Method], policy: Policy
                       ) -> dict[str, Any]:
    """What a stored repetition of `policy` measured (its file is recomputed otherwise)."""
    measured = {k: v for k, v in s.items() if k not in _REPORT_ONLY}
    ref = reference_config(cfg, s)
    return {"version": UNITS_VERSION, "alignment": measured, **start_fingerprint(cfg),
            "policy": policy.identity,
            "methods": {m: rl_config.fingerprint(run_config(cfg, m, 0), r)
                        for m, r in resolved.items()},
            "reference": rl_config.fingerprint(ref, rl_config.method(ref))}


# ----------------------------------------------------------------------------- the stage


def run(cfg: ml_collections.ConfigDict, workdir: str) -> dict[str, Any]:
    """Measure every policy (module docstring); writes `results/alignment.{json,md}` and
    returns the result with its markdown as `summary`."""
    s, resolved = validate(cfg)
    workdir = common.prepare_workdir(workdir)
    mesh = make_mesh(cfg)
    cache: dict[str, Any] = {}

    def bench_of() -> Bench:
        if "bench" not in cache:
            task, model = build_task(cfg), build_model(cfg, mesh)
            cache["bench"] = Bench.build(cfg, task, model, mesh, s, resolved)
        return cache["bench"]

    out = []
    for policy in policies(cfg, workdir, s, bench_of, mesh):
        fp = policy_fingerprint(cfg, s, resolved, policy)
        os.makedirs(os.path.join(workdir, "alignment", policy.name), exist_ok=True)
        loaded: dict[str, Any] = {}

        def compute(r: int, policy=policy, loaded=loaded) -> dict[str, Any]:
            bench = bench_of()
            if not loaded:
                params, stored = policy.load()
                loaded["params"] = params
                history, source = None, None
                if "history" in s["p_sources"]:
                    if stored is not None and s["history"] == "auto":
                        history, source = stored, "checkpoint"
                    else:
                        state = host_params(bench.uniform, params)
                        key = jax.random.fold_in(jax.random.key(s["seed"]), _WARMUP_FOLD)
                        history = warmup_history(bench.uniform, state,
                                                 int(s["warmup_epochs"]), key)
                        source = f"warm-up ({s['warmup_epochs']} epochs)"
                loaded["history"], loaded["source"] = history, source
            rec = measure_repetition(bench, loaded["params"], r, loaded["history"])
            logging.info("alignment %s rep %d: cosines %s (%.1f s)", policy.name, r,
                         {n: e["cosine"] if e["cosine"] is None else round(e["cosine"], 3)
                          for n, e in rec["estimators"].items()},
                         rec["seconds"])
            return {**rec, "history_source": loaded["source"]}

        reps = [common.cached_json(
            os.path.join(workdir, "alignment", policy.name, f"rep{r}.json"),
            {**fp, "repetition": r}, lambda r=r, compute=compute: compute(r))
            for r in range(int(s["repetitions"]))]
        for rec in reps:
            rec.pop("fingerprint", None)
        out.append({"name": policy.name, **policy.identity,
                    "history_source": reps[0].get("history_source"),
                    "summary": summarise(reps, cfg.compare.baseline, s["ci"],
                                         float(cfg.compare.level)),
                    "repetitions": reps})
    rl = cfg.rl
    result = {"exploratory": True, "config": {**s, "prompts_per_step": int(rl.prompts_per_step),
                         "rollouts_per_prompt": int(rl.rollouts_per_prompt),
                         "n_min": int(rl.allocation.n_min), "n_max": int(rl.allocation.n_max),
                         "aggregation": rl.aggregation, "baseline": cfg.compare.baseline,
                         "level": float(cfg.compare.level),
                         "methods": {m: r.to_dict() for m, r in resolved.items()}},
              "policies": out}
    result["summary"] = markdown(result)
    results = os.path.join(workdir, "results")
    os.makedirs(results, exist_ok=True)
    write_json(os.path.join(results, "alignment.json"), loop.canonical(result))
    with open(os.path.join(results, "alignment.md"), "w") as f:
        f.write(result["summary"])
    return result


__all__ = ["Bench", "DEFAULTS", "Policy", "draw_prompts", "gradient", "half",
           "measure_repetition", "oracle_history", "policies", "reference_alignment",
           "reference_config", "repetition_keys", "restrict", "run", "score_units",
           "settings", "subset", "validate", "warmup_history"]
