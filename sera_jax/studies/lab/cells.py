"""One cell of the allocation lab: methods × paired seeds, its tables and controls.

`run_cell` runs the methods (and with `controls` the null and A/A arms) of one setup on the
paired seeds; `report_cell` writes its markdown (final pass@k, paired differences, the gate,
arm − null, the A/A false-positive rate); `report_window` the same paired differences with
each seed's pass@k averaged over the last evaluation points (`maze_cell.window`,
`maze_family.window`); `report_matched` (in `report_cell` when an arm uses DAPO dynamic
sampling) each arm's pass@k at the baseline's number of generated rollouts;
`maze_cell_setup`, `maze_family_setup`, `regime_setup` the setups of the cells that change
the main cell's task or shape. Used by `study`, `sweep` and `regime`.

With a `cache_dir`, `run_cell` stores each arm's result there under the fingerprint of what
it depends on (`arm_fingerprint`) and a re-run loads it instead of training again: a killed
study resumes at the first arm it had not finished, and a changed config recomputes only
the arms it changes (a stored arm is used only under an identical fingerprint).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import time
from collections.abc import Mapping, Sequence
from typing import Any

import ml_collections
import numpy as np
from absl import logging

from sera_jax import loop
from sera_jax import methods as methods_lib
from sera_jax.studies import compare
from sera_jax.studies.lab import train

#: Control arms (`run_cell(controls=True)`): the null (uniform with the rewards of each batch
#: shuffled) and the A/A arm (uniform on another rollout stream), named as in the paired
#: studies.
NULL, AA = "null", "aa"
#: The A/A arm's name before it was `AA`: `load_arm` reads arms stored under it.
OLD_AA = "uniform_aa"


def method_for(name: str, threshold: float | None = None) -> methods_lib.Method:
    """The registered method `name`, with θ = `threshold` when it has a dynamic active set
    (`rl.allocation.threshold`; None = the preset's θ)."""
    method = methods_lib.get_method(name)
    if threshold is not None and "threshold" in method.options:
        method = methods_lib.resolve(name, {"threshold": float(threshold)})
    return method


def _computation(method: methods_lib.Method) -> tuple:
    """What a lab runner compiles for `method`, less its name and its multiplicity."""
    return (method.allocator, tuple(sorted(method.options.items())), method.estimator,
            method.dynamic_sampling)


#: The study's store of finished arms: `<workdir>/arms/` (`run_cell(cache_dir=)`).
ARMS = "arms"
#: Bump when a change to the code changes what a stored arm holds (`arm_fingerprint`).
CACHE_VERSION = 1


def arm_fingerprint(arm: str, method: methods_lib.Method, setup: train.Setup, seed: int,
                    seeds: Sequence[int], law: Any, stream: int, null: bool) -> dict[str, Any]:
    """Everything one arm's result depends on, as JSON: the arm, its resolved method, the
    whole setup (task, shape, optimiser, length), the paired seeds, the difficulty law, the
    rollout stream and the null switch."""
    law = np.asarray(law).tolist() if isinstance(law, np.ndarray) else law
    return loop.canonical({"version": CACHE_VERSION, "arm": arm, "method": method.to_dict(),
                           "setup": dataclasses.asdict(setup), "seed": int(seed),
                           "seeds": [int(s) for s in seeds], "law": law,
                           "stream": int(stream), "null": bool(null)})


def _arm_path(cache_dir: str, fingerprint: Mapping[str, Any]) -> str:
    digest = hashlib.sha256(json.dumps(fingerprint, sort_keys=True).encode()).hexdigest()
    return os.path.join(cache_dir, f"{fingerprint['arm']}_{digest[:16]}.npz")


def load_arm(cache_dir: str, fingerprint: Mapping[str, Any]) -> dict[str, np.ndarray] | None:
    """The stored result of the arm `fingerprint` in `cache_dir`, or None (not stored, torn
    by a kill, or stored under another fingerprint). The A/A arm is also found under its old
    name `OLD_AA` (a workdir of a run before the rename)."""
    stored = _load_arm(cache_dir, fingerprint)
    if stored is None and fingerprint["arm"] == AA:
        stored = _load_arm(cache_dir, {**fingerprint, "arm": OLD_AA})
    return stored


def _load_arm(cache_dir: str, fingerprint: Mapping[str, Any]) -> dict[str, np.ndarray] | None:
    path = _arm_path(cache_dir, fingerprint)
    try:
        with np.load(path) as z:
            stored = {k: z[k] for k in z.files}
    except (OSError, ValueError, EOFError):
        return None
    if json.loads(str(stored.pop("__fingerprint__", "null"))) != fingerprint:
        return None
    return stored


def save_arm(cache_dir: str, fingerprint: Mapping[str, Any],
             result: Mapping[str, np.ndarray]) -> None:
    """Store an arm's result atomically (a temporary file, then a rename)."""
    os.makedirs(cache_dir, exist_ok=True)
    path = _arm_path(cache_dir, fingerprint)
    tmp = path[:-len(".npz")] + ".tmp.npz"
    np.savez_compressed(tmp, __fingerprint__=np.asarray(json.dumps(fingerprint, sort_keys=True)),
                        **{k: np.asarray(v) for k, v in result.items()})
    os.replace(tmp, path)


def run_cell(method_names: Sequence[str], setup: train.Setup, seed: int, seeds: Sequence[int],
             laws: Mapping[str, Any], runners: dict | None = None, controls: bool = False,
             threshold: float | None = None, checked: Sequence[str] = (),
             cache_dir: str | None = None) -> dict[str, dict[str, dict[str, np.ndarray]]]:
    """results[law][arm] = `train.Runner` output on the paired seeds `seeds` of `seed`.

    Arms: the methods, and with `controls` the null arm `NULL` (uniform, rewards shuffled
    within each batch) and the A/A arm `AA` (uniform on the other rollout stream: same
    task, initial policy and data order). Tasks are built once per law and shared by every
    arm. `runners` caches compiled runners by (computation, switches, setup without its
    length), so a shape seen before (another law, another length) is not compiled again;
    arms that differ only in a traced switch share one runner (`train.Runner`): uniform, its
    A/A arm and its null; a method and its multiplicity ablation (`sera`,
    `sera_no_multiplicity`) when both are in the cell. `checked`: methods whose first step
    runs in checked mode first (`train.check_first_step`, on the first law's tasks; a failed
    check raises before any of the cell's runs). `cache_dir`: arms stored there under their
    `arm_fingerprint` are loaded, not run; the others are stored when they finish.
    """
    runners = {} if runners is None else runners
    fingerprints = {(arm, law): arm_fingerprint(arm, method, setup, seed, seeds, laws[law],
                                                stream, null)
                    for arm, method, stream, null in _arms(method_names, threshold, controls)
                    for law in laws}
    out: dict[str, dict[str, dict[str, np.ndarray]]] = {law: {} for law in laws}
    if cache_dir is not None:
        for (arm, law), fp in fingerprints.items():
            stored = load_arm(cache_dir, fp)
            if stored is not None:
                out[law][arm] = stored
        if all(arm in out[law] for arm, law in fingerprints):
            logging.info("lab: every arm of the cell loaded from %s", cache_dir)
            return out
    keys = train.seed_keys(seed, seeds)
    tasks = {law: train.make_tasks(setup, seed, seeds, spec) for law, spec in laws.items()}
    done = lambda arm: all(arm in out[law] for law in laws)  # noqa: E731 -- loaded
    for name in (n for n in method_names if n in checked and not done(n)):
        train.check_first_step(method_for(name, threshold), setup, keys,
                               tasks[next(iter(laws))])
    arms = _arms(method_names, threshold, controls)
    # Why switches: a cell's wall time is XLA compilation (a compiled run takes < 1 s).
    weightings: dict[tuple, set[bool]] = {}
    for _, method, _, _ in arms:
        weightings.setdefault(_computation(method), set()).add(method.multiplicity)
    short = setup.with_(num_steps=setup.eval_every)
    for arm, method, stream, null in arms:
        if done(arm):
            continue
        comp = _computation(method)
        need_null = controls and method.name == "uniform"
        need_mult = len(weightings[comp]) > 1 and not method.dynamic_sampling
        # A runner with a switch serves the arms without it too (same values, bit for bit).
        usable = [(comp, n, True, None, short) for n in (True, False) if n >= need_null]
        usable += [(comp, n, False, method.multiplicity, short) for n in (True, False)
                   if n >= need_null and not need_mult]
        key = next((k for k in usable if k in runners), None)
        if key is None:
            key = (comp, need_null, need_mult, None if need_mult else method.multiplicity,
                   short)
            runners[key] = train.Runner(
                dataclasses.replace(method, multiplicity=True) if need_mult else method,
                short, null_arm=need_null, multiplicity_switch=need_mult)
        for law in laws:
            if arm in out[law]:
                continue  # loaded from cache_dir
            t0 = time.time()
            out[law][arm] = runners[key](keys, tasks[law], setup.num_steps, stream, null,
                                         method.multiplicity)
            if cache_dir is not None:
                save_arm(cache_dir, fingerprints[(arm, law)], out[law][arm])
            logging.info("lab: %s on %s (%d seeds) in %.1fs", arm, law, keys.shape[0],
                         time.time() - t0)
    return out


def _arms(method_names: Sequence[str], threshold: float | None, controls: bool
          ) -> list[tuple[str, methods_lib.Method, int, bool]]:
    """(arm name, method, rollout stream, null) of a cell: the methods, then with
    `controls` the null and A/A arms."""
    arms = [(n, method_for(n, threshold), 0, False) for n in method_names]
    if controls:
        uniform = method_for("uniform", threshold)
        arms += [(NULL, uniform, 0, True), (AA, uniform, 1, False)]
    return arms


def _final(res: Mapping[str, np.ndarray], split: int, k_index: int) -> np.ndarray:
    """Per-seed final pass@k (percent)."""
    return 100.0 * res["pass_at_k"][:, -1, split, k_index]


# ----------------------------------------------------------------------------- tables


def table_final(results, ks, table_ks, split: int) -> str:
    idx = [ks.index(k) for k in table_ks]
    head = "| method | " + " | ".join(f"pass@{k}" for k in table_ks) + " |"
    lines = [head, "|---|" + "---|" * len(idx)]
    for name, res in results.items():
        vals = [f"{_final(res, split, i).mean():.2f}" for i in idx]
        lines.append(f"| {name} | " + " | ".join(vals) + " |")
    return "\n".join(lines)


def table_paired(results, ks, table_ks, split: int, reference: str, names, ci: str) -> str:
    idx = [ks.index(k) for k in table_ks]
    head = f"| method − {reference} | " + " | ".join(f"Δ pass@{k}" for k in table_ks) + " |"
    lines = [head, "|---|" + "---|" * len(idx)]
    for name in names:
        if name == reference or name not in results:
            continue
        cells = [compare.format_interval(compare.seed_difference(
                     _final(results[name], split, i), _final(results[reference], split, i), ci))
                 for i in idx]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def table_diagnostics(results) -> str:
    cols = ("cosine", "kappa_mean", "kappa_min", "phat_abs_err", "mixed_frac", "active_frac",
            "reward_mean")
    j = [train.STEP_METRICS.index(c) for c in cols]
    lines = ["| method | " + " | ".join(cols) + " | rollouts std |",
             "|---|" + "---|" * (len(cols) + 1)]
    for name, res in results.items():
        s = res["steps"]
        vals = [f"{np.nanmean(s[..., i]):.3f}" for i in j]
        c = res["counts"].astype(np.float64)
        spread = np.where(c > 0, c, np.nan)
        vals.append(f"{np.nanmean(np.nanstd(spread, axis=-1)):.2f}")
        lines.append(f"| {name} | " + " | ".join(vals) + " |")
    return "\n".join(lines)


# ----------------------------------------------------------------------------- generation


def _dynamic(name: str) -> bool:
    method = methods_lib.METHODS.get(name)
    return method is not None and method.dynamic_sampling


def generation_curve(res: Mapping[str, np.ndarray]) -> np.ndarray:
    """float64 [S, E]: each seed's cumulative generated rollouts at each evaluation point
    (0 at step 0), from the per-step `generated` metric."""
    gen = res["steps"][..., train.STEP_METRICS.index("generated")].astype(np.float64)
    every = gen.shape[1] // (res["pass_at_k"].shape[1] - 1)
    return np.concatenate([np.zeros((gen.shape[0], 1)), np.cumsum(gen, axis=1)], 1)[:, ::every]


def at_generation(res: Mapping[str, np.ndarray], target: np.ndarray, curve: np.ndarray
                  ) -> np.ndarray:
    """float64 [S, ...]: seed s's `curve` [S, E, ...] linearly interpolated between evaluation
    points over cumulative generated rollouts at `target[s]` (clamped at the last point when
    the arm generated less)."""
    x = generation_curve(res)
    flat = curve.reshape(curve.shape[:2] + (-1,))
    out = np.stack([[np.interp(target[s], x[s], flat[s, :, j]) for j in range(flat.shape[2])]
                    for s in range(x.shape[0])])
    return out.reshape((x.shape[0],) + curve.shape[2:])


def report_matched(results, ks, table_ks, ref: str, names: Sequence[str], ci: str,
                   title: str = "") -> tuple[list[str], dict[str, Any]]:
    """Markdown lines and numbers of the matched-generation table: each arm's held-out pass@k
    where its cumulative generated rollouts reach `ref`'s total (per seed, interpolated by
    `at_generation`), the paired Δ of every method of `names` vs `ref`, and each arm's mean
    generated rollouts per step. Returns (lines, {'target': [S], 'step': {arm: mean step},
    'per_step': {arm: rollouts/step}, 'pass': {arm: {k: [S] percent}}, 'paired': {name: {k:
    `compare.seed_difference`}}})."""
    idx = {int(k): list(ks).index(k) for k in table_ks}
    target = generation_curve(results[ref])[:, -1]
    out: dict[str, Any] = {"target": target, "step": {}, "per_step": {}, "pass": {},
                           "paired": {}}
    for arm, res in results.items():
        num_e = res["pass_at_k"].shape[1]
        steps = np.arange(num_e) * (res["steps"].shape[1] // (num_e - 1))
        curve = np.broadcast_to(steps.astype(np.float64), res["pass_at_k"].shape[:2])
        out["step"][arm] = float(at_generation(res, target, curve).mean())
        gen = res["steps"][..., train.STEP_METRICS.index("generated")]
        out["per_step"][arm] = float(gen.mean())
        held = 100.0 * at_generation(res, target, res["pass_at_k"][:, :, 1])
        out["pass"][arm] = {k: held[:, i] for k, i in idx.items()}
    for name in names:
        if name != ref and name in results:
            out["paired"][name] = {k: compare.seed_difference(
                out["pass"][name][k], out["pass"][ref][k], ci) for k in idx}
    cols = " | ".join(f"pass@{k}" for k in idx)
    lines = [f"## {title}At matched generation: held-out pass@k (%) where each arm's cumulative "
             f"generated rollouts reach {ref}'s total ({target.mean():.0f} per seed), each "
             "seed's curve linearly interpolated between evaluations over cumulative generated "
             "rollouts", "",
             "Dynamic sampling also generates the groups it drops, so its arms are read at an "
             "earlier step; an arm that generated less than the total is read at its last "
             "evaluation.", "",
             f"| arm | rollouts/step | step | {cols} |", "|---|---|---|" + "---|" * len(idx)]
    lines += [f"| {a} | {out['per_step'][a]:.1f} | {out['step'][a]:.1f} | "
              + " | ".join(f"{v.mean():.2f}" for v in out["pass"][a].values()) + " |"
              for a in results]
    lines += ["", f"| method − {ref} | " + " | ".join(f"Δ pass@{k}" for k in idx) + " |",
              "|---|" + "---|" * len(idx)]
    lines += [f"| {n} | " + " | ".join(compare.format_interval(p) for p in d.values()) + " |"
              for n, d in out["paired"].items()]
    return lines + [""], out


# ----------------------------------------------------------------------------- controls


def gate(results, ks: Sequence[int], ci: str) -> dict[str, Any]:
    """The learning-rate gate: the paired Δ uniform − null of final held-out pass@1 (points);
    the lr is admissible only if its CI lies above 0 (uniform learns more than noise).
    Returns {'delta': `compare.seed_difference` of uniform − null, 'admissible'}."""
    i = list(ks).index(1)
    d = compare.seed_difference(_final(results["uniform"], 1, i), _final(results[NULL], 1, i),
                                ci)
    return {"delta": d, "admissible": bool(d["lo"] > 0)}


def gate_line(g: Mapping[str, Any], lr: float) -> str:
    verdict = ("ADMISSIBLE (uniform beats the null at pass@1)" if g["admissible"] else
               "NOT ADMISSIBLE (uniform does not beat the null at pass@1: the comparison "
               "below measures optimiser noise, not learning)")
    return (f"**Gate, lr {lr}:** uniform − null pass@1 = "
            f"{compare.format_interval(g['delta'])} → {verdict}.")


def aa_false_positives(results, ci: str, split: int = 1) -> tuple[int, int]:
    """(cells whose paired CI of `AA` − uniform excludes 0, cells), over every k of
    eval.ks × every evaluation after step 0. The two arms differ only in their rollout key,
    so every such cell is a false positive (the cells are correlated: a rate, not a test)."""
    a, b = results[AA]["pass_at_k"], results["uniform"]["pass_at_k"]
    cells = [(e, i) for e in range(1, a.shape[1]) for i in range(a.shape[3])]
    sig = sum(compare.excludes_zero(compare.seed_difference(
        100 * a[:, e, split, i], 100 * b[:, e, split, i], ci)) for e, i in cells)
    return int(sig), len(cells)


def report_cell(results, ks, table_ks, ref: str, names: Sequence[str], ci: str,
                controls: bool, lr: float, title: str = "") -> tuple[list[str], dict | None]:
    """Markdown lines of one cell (final pass@k of every arm, paired Δ vs `ref`, and with
    `controls` the gate, every arm − null and the A/A false-positive rate) and its gate."""
    lines = [f"## {title}Final held-out pass@k (%)", "", table_final(results, ks, table_ks, 1),
             "", f"## {title}Paired differences vs {ref} (held-out, points)", "",
             table_paired(results, ks, table_ks, 1, ref, names, ci), ""]
    if any(_dynamic(n) for n in names):
        lines += report_matched(results, ks, table_ks, ref, names, ci, title)[0]
    if not controls:
        return lines, None
    g = gate(results, ks, ci)
    sig, cells = aa_false_positives(results, ci)
    lines += [f"## {title}Controls: gate, null, A/A (held-out, points)", "",
              "null = uniform with the rewards of each batch shuffled (same lr, budget and "
              f"rollouts); {AA} = uniform on another rollout stream (same task, initial "
              "policy and data order).", "", gate_line(g, lr), "",
              table_paired(results, ks, table_ks, 1, NULL, list(names) + [AA], ci), "",
              f"A/A: {AA} − uniform has a CI excluding 0 in {sig} of {cells} (k, "
              f"evaluation) cells ({100 * sig / cells:.1f} %; 5 % if the CIs were nominal and "
              "the cells independent).", "",
              table_paired(results, ks, table_ks, 1, "uniform", [AA], ci), ""]
    return lines, {**g, "aa_false_positives": (sig, cells)}



def _setup(config: ml_collections.ConfigDict, **changes) -> train.Setup:
    return train.setup_from_config(config).with_(**changes)


def maze_cell_setup(config: ml_collections.ConfigDict) -> train.Setup:
    mc = config.maze_cell
    return _setup(config, prompts_per_step=mc.prompts_per_step, n0=mc.rollouts_per_prompt,
                  n_max=mc.n_max, num_steps=mc.num_steps, eval_every=mc.eval_every)


def maze_family_setup(config: ml_collections.ConfigDict) -> train.Setup:
    mf = config.maze_family
    return _setup(config, family="maze", maze_size=mf.maze_size, maze_openings=mf.maze_openings,
                  horizon=mf.horizon, min_path=mf.min_path, init_blocked=mf.init_blocked,
                  num_train=mf.num_train, num_test=mf.num_test,
                  prompts_per_step=mf.prompts_per_step, n0=mf.rollouts_per_prompt,
                  n_max=mf.n_max, num_steps=mf.num_steps, eval_every=mf.eval_every,
                  aggregation=mf.aggregation,
                  optimizer=tuple(sorted({**dict(config.rl.optimizer),
                                          "learning_rate": mf.learning_rate}.items())))


def regime_setup(config: ml_collections.ConfigDict, shape: Sequence[int]) -> train.Setup:
    rg = config.regime
    p, n0, n_max = shape
    return _setup(config, prompts_per_step=p, n0=n0, n_max=n_max, num_steps=rg.num_steps,
                  eval_every=rg.eval_every)



# ----------------------------------------------------------------------------- window


def _window(res: Mapping[str, np.ndarray], split: int, k_index: int, window: int) -> np.ndarray:
    """Per-seed pass@k (percent) averaged over the last `window` evaluation points."""
    return 100.0 * res["pass_at_k"][:, -window:, split, k_index].mean(1)


def window_pairs(results, names: Sequence[str]) -> list[tuple[str, str]]:
    """(a, b) for a − b: each method minus each method listed before it in `names`, then each
    method minus the null (when the null arm ran)."""
    names = [n for n in names if n in results]
    pairs = [(b, a) for i, a in enumerate(names) for b in names[i + 1:]]
    return pairs + ([(n, NULL) for n in names] if NULL in results else [])


def report_window(results, steps: Sequence[int], ks, table_ks, names: Sequence[str], ci: str,
                  window: int, lr: float, title: str = "") -> tuple[list[str], dict[str, Any]]:
    """Markdown lines and numbers of the window endpoint: each seed's held-out pass@k averaged
    over the last `window` evaluation points (`steps`: the cell's evaluation steps), per arm,
    and the paired differences of `window_pairs` with their CIs; with the null arm also the
    gate (uniform − null at the final pass@1). Returns (lines, {'steps', 'start': {k: mean
    step-0 pass@k}, 'mean': {arm: {k: mean}}, 'paired': {(a, b): {k:
    `compare.seed_difference`}},
    'gate'}); the gate is None without the null arm."""
    idx = {int(k): ks.index(k) for k in table_ks}
    w_steps = [int(s) for s in steps[-window:]]
    first = next(iter(results.values()))  # every arm starts from the same policy
    out: dict[str, Any] = {
        "steps": w_steps,
        "start": {k: float(100 * first["pass_at_k"][:, 0, 1, i].mean()) for k, i in idx.items()},
        "mean": {n: {k: float(_window(r, 1, i, window).mean()) for k, i in idx.items()}
                 for n, r in results.items()},
        "paired": {(a, b): {k: compare.seed_difference(_window(results[a], 1, i, window),
                                                       _window(results[b], 1, i, window), ci)
                            for k, i in idx.items()}
                   for a, b in window_pairs(results, names)},
        "gate": None}
    cols = " | ".join(f"pass@{k}" for k in idx)
    lines = [f"## {title}Window: held-out pass@k averaged over steps "
             f"{'/'.join(map(str, w_steps))} (the last {window} evaluations)", "",
             "Each seed's pass@k is averaged over these evaluation points, then paired over "
             f"seeds; the gate is at the final step {int(steps[-1])}.", ""]
    if NULL in results and "uniform" in results and 1 in ks:
        out["gate"] = gate(results, ks, ci)
        lines += [gate_line(out["gate"], lr), ""]
    lines += [f"| arm | {cols} |", "|---|" + "---|" * len(idx),
              "| start (step 0) | " + " | ".join(f"{v:.2f}" for v in out["start"].values())
              + " |"]
    lines += [f"| {n} | " + " | ".join(f"{v:.2f}" for v in m.values()) + " |"
              for n, m in out["mean"].items()]
    lines += ["", "| a − b | " + " | ".join(f"Δ pass@{k}" for k in idx) + " |",
              "|---|" + "---|" * len(idx)]
    lines += [f"| {a} − {b} | " + " | ".join(compare.format_interval(p) for p in d.values())
              + " |" for (a, b), d in out["paired"].items()]
    return lines + [""], out
