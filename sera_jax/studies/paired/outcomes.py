"""Outcome classes of scored samples (issue 49): where an arm's pass@1 gain comes from.

A record's `"outcomes"` (`evaluation.outcome_fields`) holds, per prompt, one string of its
samples' `OUTCOMES` indices (0 correct, 1 wrong, 2 no answer, 3 truncated). With N samples:

    answered a = (#correct + #wrong) / N     (a readable, untruncated answer)
    accuracy c = #correct / (#correct + #wrong)
    pass@1   p = #correct / N = a · c

so a gain in pass@1 of an arm over a reference splits exactly into

    p1 − p0 = (a1 − a0)·c0   [format: more answers, at the reference's accuracy]
            + a1·(c1 − c0)   [correctness: better answers]

Seeds are the unit: per seed the arm is decomposed against the start (one policy, scored with
the same keys) or against another arm of the same seed, and each component is summarised by its
mean over seeds with a two-sided Student t interval (`compare.seed_interval`).
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from fractions import Fraction
from typing import Any

import numpy as np

from sera_jax.rl.evaluate import OUTCOMES
from sera_jax.studies.compare import seed_interval

PARTS = ("gain", "format", "correctness")
ONE_SEED = "one seed: no interval"


def parse(strings: Sequence[str]) -> np.ndarray:
    """int8 [P, n] outcome indices from a record's `"outcomes"` strings (one per prompt).
    ValueError on no prompts, empty or ragged rows, or characters outside 0-3."""
    rows = list(strings)
    if not rows:
        raise ValueError("outcomes: no prompts")
    for i, row in enumerate(rows):
        if not isinstance(row, str):
            raise ValueError(f"outcomes: prompt {i} is {type(row).__name__}, not a string")
    n = len(rows[0])
    if n == 0:
        raise ValueError("outcomes: prompt 0 has no samples")
    for i, row in enumerate(rows):
        if len(row) != n:
            raise ValueError(f"outcomes: ragged rows: prompt {i} has {len(row)} samples, "
                             f"prompt 0 has {n}")
        bad = sorted(set(row) - set("0123"))
        if bad:
            raise ValueError(f"outcomes: prompt {i} has characters {bad} outside 0-3 "
                             f"({', '.join(f'{k}={o}' for k, o in enumerate(OUTCOMES))})")
    codes = np.frombuffer("".join(rows).encode("ascii"), np.uint8).reshape(len(rows), n)
    return (codes - ord("0")).astype(np.int8)


def _check(x: Any, name: str = "outcomes") -> np.ndarray:
    x = np.asarray(x)
    if x.ndim != 2 or x.size == 0:
        raise ValueError(f"{name}: need a non-empty [P, n] array, got shape {x.shape}")
    if not np.issubdtype(x.dtype, np.integer) or x.min() < 0 or x.max() >= len(OUTCOMES):
        raise ValueError(f"{name}: values must be integer class indices 0-{len(OUTCOMES) - 1}")
    return x.astype(np.int8)


def _groups(groups: Sequence[Hashable], num_prompts: int) -> dict[Hashable, np.ndarray]:
    """{label: row mask}, labels in order of first appearance."""
    labels = list(groups)
    if len(labels) != num_prompts:
        raise ValueError(f"groups: {len(labels)} labels for {num_prompts} prompts")
    order = list(dict.fromkeys(labels))
    arr = np.empty(len(labels), object)
    arr[:] = labels
    return {g: arr == g for g in order}


def rates(outcomes: np.ndarray, groups: Sequence[Hashable] | None = None) -> dict[str, Any]:
    """Share of each class over all P·n samples, `answered` = correct + wrong,
    `accuracy` = correct / answered (None when nothing is answered), `pass1` = correct;
    with `groups` (one label per prompt) also `by_group: {label: the same dict}`."""
    x = _check(outcomes)
    out: dict[str, Any] = {name: float((x == i).mean()) for i, name in enumerate(OUTCOMES)}
    correct, answered = int((x == 0).sum()), int((x <= 1).sum())
    out.update(answered=answered / x.size, accuracy=correct / answered if answered else None,
               pass1=correct / x.size, num_prompts=int(x.shape[0]), num_samples=int(x.shape[1]))
    if groups is not None:
        out["by_group"] = {g: rates(x[m]) for g, m in _groups(groups, x.shape[0]).items()}
    return out


def _decompose(arm: np.ndarray, ref: np.ndarray, ref_name: str) -> dict[str, float]:
    arm, ref = _check(arm, "arm"), _check(ref, ref_name)
    if arm.shape != ref.shape:
        raise ValueError(f"arm {arm.shape} and {ref_name} {ref.shape}: need the same problems "
                         "and sample count")
    n = arm.size

    def ac(x: np.ndarray) -> tuple[Fraction, Fraction]:
        answered, correct = int((x <= 1).sum()), int((x == 0).sum())
        return Fraction(answered, n), Fraction(correct, answered) if answered else Fraction(0)

    (a1, c1), (a0, c0) = ac(arm), ac(ref)
    fmt, cor = float((a1 - a0) * c0), float(a1 * (c1 - c0))
    return {"gain": fmt + cor, "format": fmt, "correctness": cor,
            f"answered_{ref_name}": float(a0), "answered_arm": float(a1),
            f"accuracy_{ref_name}": float(c0), "accuracy_arm": float(c1)}


def decompose(arm: np.ndarray, start: np.ndarray) -> dict[str, float]:
    """The pass@1 gain of `arm` over `start` (both [P, n] on the same problems), split as
    gain = a1·c1 − a0·c0 = (a1 − a0)·c0 [format] + a1·(c1 − c0) [correctness], with a the
    answered share and c the accuracy among answered samples. A policy that answers nothing
    has c = 0 (so with a0 = 0 all of the gain is correctness, c0 = 0). The components are
    computed exactly (rationals) and rounded once; `gain` is format + correctness, equal to
    pass1(arm) − pass1(start) up to one rounding."""
    return _decompose(arm, start, "start")


def _summary(per_seed: Mapping[int, Mapping[str, float]], level: float) -> dict[str, Any]:
    seeds = sorted(per_seed)
    out: dict[str, Any] = {"seeds": seeds, "level": float(level)}
    for key in per_seed[seeds[0]]:
        e = seed_interval([per_seed[s][key] for s in seeds], level)
        out[key] = {"mean": e["mean"], "sd": e["sd"],
                    "ci": None if e["lo"] is None else [e["lo"], e["hi"]]}
    # the means add up exactly, like each seed's components
    out["gain"]["mean"] = out["format"]["mean"] + out["correctness"]["mean"]
    if len(seeds) == 1:
        out["note"] = ONE_SEED
    return out


def _paired(arm_by_seed: Mapping[int, np.ndarray], ref_by_seed: Mapping[int, np.ndarray],
            ref_name: str, groups: Sequence[Hashable] | None, level: float) -> dict[str, Any]:
    if not arm_by_seed:
        raise ValueError("no seeds")
    per_seed = {int(s): _decompose(arm_by_seed[s], ref_by_seed[s], ref_name)
                for s in arm_by_seed}
    out = {**_summary(per_seed, level), "reference": ref_name, "per_seed": per_seed}
    if groups is not None:
        masks = _groups(groups, np.asarray(next(iter(arm_by_seed.values()))).shape[0])
        out["by_group"] = {}
        for g, m in masks.items():
            ps = {int(s): _decompose(np.asarray(arm_by_seed[s])[m],
                                     np.asarray(ref_by_seed[s])[m], ref_name)
                  for s in arm_by_seed}
            out["by_group"][g] = {**_summary(ps, level), "num_prompts": int(m.sum()),
                                  "per_seed": ps}
    return out


def _missing(a: Mapping[int, Any], b: Mapping[int, Any], a_name: str, b_name: str) -> None:
    only_a, only_b = sorted(set(a) - set(b)), sorted(set(b) - set(a))
    if only_a or only_b:
        raise ValueError(f"seeds differ: missing from {b_name}: {only_a}; "
                         f"missing from {a_name}: {only_b}")


def paired_decomposition(arm_by_seed: Mapping[int, np.ndarray],
                         start: np.ndarray | Mapping[int, np.ndarray],
                         groups: Sequence[Hashable] | None = None,
                         level: float = 0.95) -> dict[str, Any]:
    """Per seed `decompose(arm[s], start)` (`start` one [P, n] array, the start scored with the
    same keys, or {seed: array} with every arm seed), then for each component {mean, sd, ci}:
    the mean over S seeds and the two-sided t interval mean ± t_{(1+level)/2, S−1}·sd/√S
    (ci None and `note` "one seed: no interval" with one seed); `gain.mean` is
    format.mean + correctness.mean. Also `seeds`, `level`, `per_seed` and, with `groups`,
    `by_group: {label: the same over that group's prompts}`."""
    if isinstance(start, Mapping):
        missing = sorted(set(arm_by_seed) - set(start))
        if missing:
            raise ValueError(f"start: no scoring for seeds {missing}")
        ref = start
    else:
        ref = {s: start for s in arm_by_seed}
    return _paired(arm_by_seed, ref, "start", groups, level)


def difference_decomposition(arm_by_seed: Mapping[int, np.ndarray],
                             base_by_seed: Mapping[int, np.ndarray],
                             groups: Sequence[Hashable] | None = None,
                             level: float = 0.95) -> dict[str, Any]:
    """The pass@1 difference arm − base (e.g. SERA − uniform) paired by seed, decomposed as
    format = (a_arm − a_base)·c_base, correctness = a_arm·(c_arm − c_base), summarised over
    seeds as in `paired_decomposition` (keys `answered_base`, `accuracy_base`). The two arms
    must have the same seeds (ValueError naming the missing ones)."""
    _missing(arm_by_seed, base_by_seed, "arm", "base")
    return _paired(arm_by_seed, base_by_seed, "base", groups, level)


def _pp(x: float | None) -> str:
    return "–" if x is None else f"{100 * x:+.2f}"


def markdown(decomp: Mapping[str, Any], title: str) -> str:
    """A table of a `paired_decomposition` / `difference_decomposition`: one row per component
    (gain, format, correctness) in percentage points with its t interval, then the same per
    group when present."""
    ref = decomp.get("reference", "start")
    level = int(round(100 * decomp["level"]))
    lines = [f"### {title}", "",
             f"pass@1 gain over {ref} = format (more answers at {ref}'s accuracy) + "
             f"correctness (better answers); mean over {len(decomp['seeds'])} seed(s), "
             f"{level}% t interval over seeds"
             + (f" ({decomp['note']})" if decomp.get("note") else "") + ".", "",
             f"| group | component | mean (pp) | {level}% CI (pp) | answered {ref} → arm | "
             f"accuracy {ref} → arm |",
             "|---|---|---:|---|---|---|"]

    def rows(label: str, d: Mapping[str, Any]) -> None:
        ans = (f"{100 * d[f'answered_{ref}']['mean']:.1f}% → "
               f"{100 * d['answered_arm']['mean']:.1f}%")
        acc = (f"{100 * d[f'accuracy_{ref}']['mean']:.1f}% → "
               f"{100 * d['accuracy_arm']['mean']:.1f}%")
        for i, part in enumerate(PARTS):
            ci = d[part]["ci"]
            ci_s = "–" if ci is None else f"[{_pp(ci[0])}, {_pp(ci[1])}]"
            lines.append(f"| {label if i == 0 else ''} | {part} | {_pp(d[part]['mean'])} | "
                         f"{ci_s} | {ans if i == 0 else ''} | {acc if i == 0 else ''} |")

    rows("all", decomp)
    for g, d in decomp.get("by_group", {}).items():
        rows(str(g), d)
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------- the study

#: The export's per-sample file (`outcome_arrays`; `recompute` rebuilds `outcomes.json`).
OUTCOMES_FILE = "outcomes.npz"


def _put(arrays: dict[str, np.ndarray], key: str, rec: Mapping[str, Any] | None) -> None:
    """A record's per-sample classes (and lengths) per scored split, when it has them."""
    if rec is None:
        return
    for split, sub in [("eval", rec)] + [(s, rec[s]) for s in ("train", "test") if s in rec]:
        if "outcomes" in sub:
            arrays[f"{key}/{split}"] = parse(sub["outcomes"])
            arrays[f"{key}/{split}/lengths"] = np.minimum(
                np.asarray(sub["lengths"]), 65535).astype(np.uint16)


def outcome_arrays(data: Mapping[str, Any], prefix: str = "", sft: bool = True
                   ) -> dict[str, np.ndarray]:
    """`report.gather`'s per-sample classes as flat int8 [P, n] arrays (lengths uint16 under
    `<key>/lengths`): the start at every scoring (`sft/<step>_<n>_<keys>/<split>`), each
    run's final point (`run/<arm>/<seed>/final/<split>`) and curve points
    (`run/<arm>/<seed>/curve/<step>/<split>`). Empty when no record carries outcomes."""
    out: dict[str, np.ndarray] = {}
    if sft:
        for (step, n, keys), rec in data.get("points", {}).items():
            _put(out, f"{prefix}sft/{step}_{n}_{keys}", rec)
    for arm, runs in data.get("runs", {}).items():
        for seed, r in runs.items():
            key = f"{prefix}run/{arm}/{seed}"
            _put(out, f"{key}/final", r["final"])
            for step, rec in (r.get("curve") or {}).items():
                _put(out, f"{key}/curve/{step}", rec)
    return out


def summarise(arrays: Mapping[str, np.ndarray], start_key: str, splits: Sequence[str],
              templates: Mapping[str, Sequence[str]], baseline: str, level: float = 0.95
              ) -> dict[str, Any]:
    """What `outcomes.json` reports, a pure function of `outcome_arrays` (so `recompute`
    rebuilds it): per split, the start's rates (`start_key`, e.g. "sft/60_16_1234": the
    start scored with the final point's keys), every arm's rates per seed and its
    `paired_decomposition` against that start at the final point, and every other arm's
    `difference_decomposition` against `baseline` on their common seeds; per template
    (`templates[split]`, one label per prompt) throughout."""
    out: dict[str, Any] = {"level": float(level), "start": start_key, "baseline": baseline,
                           "classes": list(OUTCOMES), "splits": {}}
    for split in splits:
        if f"{start_key}/{split}" not in arrays:
            continue
        start = arrays[f"{start_key}/{split}"]
        groups = list(templates[split])[: start.shape[0]]
        finals: dict[str, dict[int, np.ndarray]] = {}
        for key, x in arrays.items():
            parts = key.split("/")
            if len(parts) == 5 and parts[0] == "run" and parts[3:] == ["final", split]:
                finals.setdefault(parts[1], {})[int(parts[2])] = x
        s_out: dict[str, Any] = {"start": rates(start, groups), "arms": {}, "vs_baseline": {}}
        for arm, by_seed in finals.items():
            s_out["arms"][arm] = {
                "rates": {s: rates(x) for s, x in sorted(by_seed.items())},
                "vs_start": paired_decomposition(by_seed, start, groups, level)}
        base = finals.get(baseline, {})
        for arm, by_seed in finals.items():
            common = sorted(set(by_seed) & set(base))
            if arm != baseline and common:
                s_out["vs_baseline"][arm] = difference_decomposition(
                    {s: by_seed[s] for s in common}, {s: base[s] for s in common}, groups,
                    level)
        out["splits"][split] = s_out
    return out


def summary_markdown(summary: Mapping[str, Any]) -> str:
    """`outcomes.md`: per split, the start's classes, then each arm's gain over the start and
    each arm's difference from the baseline, split into format and correctness."""
    lines = ["# Outcomes per sample: format and correctness", "",
             f"Start scored with the final point's keys (`{summary['start']}`); classes "
             f"{', '.join(summary['classes'])}.", ""]
    for split, s in summary["splits"].items():
        st = s["start"]
        lines += [f"## Split `{split}`", "",
                  f"Start: correct {100 * st['correct']:.1f} %, wrong {100 * st['wrong']:.1f} %,"
                  f" no answer {100 * st['no_answer']:.1f} %, truncated "
                  f"{100 * st['truncated']:.1f} %.", ""]
        for arm, a in s["arms"].items():
            lines.append(markdown(a["vs_start"], f"{arm} − start ({split})"))
        for arm, d in s["vs_baseline"].items():
            lines.append(markdown(d, f"{arm} − {summary['baseline']} ({split})"))
    return "\n".join(lines)
