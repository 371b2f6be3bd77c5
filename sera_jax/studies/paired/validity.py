"""Task validity: does the start read the prompt, or does it guess?

The start stage writes `sft/validity.json` (`sft_validity`): the kind's blind control
(`Kind.blind_validity`: the maze-blind or answer-blind guesser) on the held-out prompts the
study evaluates (exact blind pass@k at the evaluation's ks, distinct answers, the share of
held-out answers that are also answers it draws from) beside the start's held-out pass@k
(step-0 keys, final sample size) and the ratios start / blind at every k.

The validity gate (`check_validity`), read before any RL run (`require_readable`: stages
rl / compare / all / frontier / matched): the start reads its prompts only when

* its held-out pass@1 is at least `compare.validity_pass1_ratio` (2) × the blind pass@1, and
* the blind pass@k is at most `compare.validity_blind_share` (0.5) × the start's pass@k, at
  k = `compare.validity_k` (0 = the primary endpoint's k, else min(64, eval.num_samples)).

Otherwise the study refuses with one StudyError naming the numbers and the override
`compare.allow_blind_task=True` (a documented exploration: the override is logged and
recorded in comparison.json / frontier.json / matched.json under "validity").

The blind control is the kind's default guesser unless `compare.blind` names another
(`blind_choice`; the math kind's "strongest" is the best of its answer-blind guessers,
`kinds.lm.blind_guessers`); a config without the field, or with "frequency", computes and
caches exactly what it did before the field existed.

With a sealed test split scored (`eval.test_prompts` > 0) the blind control and the check
are also computed on its prompts (the start's step-0 test counts) and reported beside the
held-out ones (`"test"` in the report and the record); a primary endpoint on "test" is gated
on the test split (`gate_split`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import ml_collections
import numpy as np
from absl import logging

from sera_jax.records import read_json
from sera_jax.studies import common
from sera_jax.studies import compare as cmp
from sera_jax.studies.paired.kinds import get_kind
from sera_jax.studies.paired.spec import (
    VALIDITY_DEFAULTS,
    build_task,
    primary_split,
    start_fingerprint,
    test_prompts,
    test_split,
)

VALIDITY = "validity.json"
OVERRIDE = "compare.allow_blind_task=True"


def validity_settings(cfg: ml_collections.ConfigDict) -> dict[str, Any]:
    """The validity fields of `cfg.compare`, each filled with `VALIDITY_DEFAULTS` when the
    config predates it; `k` resolved (0 -> the primary k, else min(64, eval.num_samples))."""
    s = {f: cfg.compare.get(f, d) for f, d in VALIDITY_DEFAULTS.items()}
    k = int(s["validity_k"])
    if k == 0:
        primary = cfg.compare.get("primary")
        k = int(primary.k) if primary is not None else min(64, int(cfg.eval.num_samples))
    return {"allow_blind_task": bool(s["allow_blind_task"]),
            "pass1_ratio": float(s["validity_pass1_ratio"]),
            "blind_share": float(s["validity_blind_share"]), "k": k}


def blind_choice(cfg: ml_collections.ConfigDict) -> str:
    """`compare.blind` ("frequency" when unset), checked against the guessers the kind
    offers (its `blind_choices`; a kind without them has only "frequency")."""
    blind = cfg.compare.get("blind") or "frequency"  # None: the default guesser
    choices = getattr(get_kind(cfg), "blind_choices", ("frequency",))
    common.check(blind in choices, "compare.blind", blind, f"one of {tuple(choices)}")
    return blind


def check_validity(start: Mapping[str, float], blind: Mapping[str, float], k: int,
                   pass1_ratio: float = 2.0, blind_share: float = 0.5) -> dict[str, Any]:
    """The validity gate on held-out pass@k dicts (keys `str(k)`, values in [0, 1]) of the
    SFT start and the blind control: passes iff start pass@1 >= `pass1_ratio` × blind pass@1
    and blind pass@k <= `blind_share` × start pass@k. Returns the numbers, `passes` and one
    `reasons` line per failed condition."""
    s1, b1 = float(start["1"]), float(blind["1"])
    sk, bk = float(start[str(k)]), float(blind[str(k)])
    reasons = []
    if s1 < pass1_ratio * b1:
        reasons.append(f"start held-out pass@1 {100 * s1:.2f} % < {pass1_ratio:g} × blind "
                       f"pass@1 {100 * b1:.2f} %")
    if bk > blind_share * sk:
        reasons.append(f"blind pass@{k} {100 * bk:.1f} % > {blind_share:g} × start pass@{k} "
                       f"{100 * sk:.1f} %")
    return {"passes": not reasons, "reasons": reasons, "k": int(k),
            "pass1_ratio": float(pass1_ratio), "blind_share": float(blind_share),
            "start_pass1": s1, "blind_pass1": b1, f"start_pass{k}": sk, f"blind_pass{k}": bk,
            "ratio_pass1": s1 / b1 if b1 > 0 else None,
            f"ratio_pass{k}": sk / bk if bk > 0 else None}


def _start_pass_at_k(num_correct: Any, n: int, ks: list[int]) -> dict[str, float]:
    v = cmp.per_prompt_pass_at_k(np.asarray(num_correct), n, ks).mean(axis=-1)
    return {str(k): float(x) for k, x in zip(ks, v)}


def sft_validity(cfg: ml_collections.ConfigDict, sft_dir: str, start: Mapping[str, Any],
                 sft_step: int | None) -> dict[str, Any]:
    """`sft/validity.json` (module docstring), cached under the task, SFT checkpoint,
    evaluation and threshold fingerprint; `start`: the SFT start's held-out record at step 0
    (final size, `eval.seed` keys: `sft/eval.json`'s "final")."""
    settings = validity_settings(cfg)
    blind_name = blind_choice(cfg)
    # The default guesser is asked as before the option existed (a kind without it).
    options = {} if blind_name == "frequency" else {"blind": blind_name}
    n = int(start["num_samples"])
    ks = sorted(set(cmp.ks_for(n)) | {settings["k"]})

    def one(task: Any, split: str, num_prompts: int, counts: Any) -> dict[str, Any]:
        report = get_kind(cfg).blind_validity(task, split, num_prompts, ks, **options)
        start_k = _start_pass_at_k(counts, n, ks)
        blind = report["blind_pass_at_k"]
        check = check_validity(start_k, blind, settings["k"], settings["pass1_ratio"],
                               settings["blind_share"])
        return {**report, "ks": ks, "start_pass_at_k": start_k, "start_num_samples": n,
                "ratio_start_over_blind": {k: (start_k[k] / blind[k] if blind[k] > 0 else None)
                                           for k in blind},
                "check": check}

    n_test = test_prompts(cfg)

    def compute() -> dict[str, Any]:
        task = build_task(cfg)
        out = one(task, "eval", int(cfg.eval.num_prompts), start["num_correct"])
        if n_test > 0:  # the sealed test split, beside the held-out one
            out["test"] = one(task, "test", n_test, start["test"]["num_correct"])
        return out

    fingerprint = {**start_fingerprint(cfg), "sft_step": sft_step,
                   "start": {"num_samples": n, "key_seed": start.get("key_seed"),
                             "num_correct": list(start["num_correct"])},
                   "num_prompts": int(cfg.eval.num_prompts),
                   "thresholds": {k: v for k, v in settings.items() if k != "allow_blind_task"},
                   **options}  # "blind" only when not the default: older caches still hold
    if n_test > 0:
        fingerprint["test"] = {"num_prompts": n_test, "split": test_split(cfg),
                               "num_correct": list(start["test"]["num_correct"])}
    out = common.cached_json(os.path.join(sft_dir, VALIDITY), fingerprint, compute)
    return out


def validity_line(report: Mapping[str, Any]) -> str:
    """One line for the log and the tables: blind vs start at pass@1 and the gate's k."""
    c = report["check"]
    k = c["k"]
    kind = get_kind(report.get("kind") or "maze")  # reports before kinds: the maze's
    what, seen, reads = kind.held_out_phrase(report), kind.words.seen, kind.words.reads
    return (f"task validity ({what}, {report['distinct_answers']} distinct answers, "
            f"{100 * report['seen_in_sft']:.0f} % {seen}): start pass@1 "
            f"{100 * c['start_pass1']:.2f} % vs blind {100 * c['blind_pass1']:.2f} %, "
            f"pass@{k} {100 * c[f'start_pass{k}']:.1f} % vs blind {100 * c[f'blind_pass{k}']:.1f}"
            f" % -- {reads if c['passes'] else 'FAILS: ' + '; '.join(c['reasons'])}")


def read_validity(sft_dir: str) -> dict[str, Any] | None:
    """`sft/validity.json`, or None when the SFT stage predates it."""
    path = os.path.join(sft_dir, VALIDITY)
    return read_json(path) if os.path.exists(path) else None


def validity_record(cfg: ml_collections.ConfigDict, sft_dir: str) -> dict[str, Any]:
    """The gate's numbers for the outputs: {**check, override, allow_blind_task, line,
    blind / start pass@k, distinct answers, seen_in_sft}; the report is the SFT stage's
    `sft/validity.json`, recomputed here when missing or stale (from `sft/eval.json`)."""
    sft_eval = read_json(os.path.join(sft_dir, "eval.json"))
    report = sft_validity(cfg, sft_dir, sft_eval["final"],
                          sft_eval.get("fingerprint", {}).get("sft_step"))
    allow = validity_settings(cfg)["allow_blind_task"]

    def record(rep: Mapping[str, Any]) -> dict[str, Any]:
        check = rep["check"]
        return {**check, "override": bool(allow and not check["passes"]),
                "allow_blind_task": allow, "line": validity_line(rep),
                "blind_pass_at_k": rep["blind_pass_at_k"],
                "start_pass_at_k": rep["start_pass_at_k"],
                "distinct_answers": rep["distinct_answers"],
                "distinct_sft_answers": rep["distinct_sft_answers"],
                "seen_in_sft": rep["seen_in_sft"],
                "num_prompts": rep.get("num_prompts", rep.get("num_mazes")),
                # another guesser than the default: which, and every guesser's pass@k
                **({"blind": rep["blind"], "guessers": rep["guessers"]}
                   if rep.get("blind", "frequency") != "frequency" else {})}

    # Relative to the workdir: outputs name no machine's folders.
    out = {**record(report),
           "path": os.path.join(os.path.basename(os.path.normpath(sft_dir)), VALIDITY)}
    if "test" in report:
        out["test"] = record(report["test"])
        if primary_split(cfg) == "test":  # the gate reads the primary's (sealed) split
            out["gate_split"] = "test"
            out["override"] = out["test"]["override"]
    return out


def gate_check(rec: Mapping[str, Any]) -> Mapping[str, Any]:
    """The part of a `validity_record` the gate reads: its test block when `gate_split` is
    "test", else the held-out record itself."""
    return rec["test"] if rec.get("gate_split") == "test" else rec


def require_readable(cfg: ml_collections.ConfigDict, sft_dir: str, what: str
                     ) -> dict[str, Any]:
    """Refuse `what` (a stage) on a start that does not clearly read its prompts (one
    StudyError naming the numbers and the override), unless `compare.allow_blind_task`;
    returns `validity_record`."""
    rec = validity_record(cfg, sft_dir)
    gate = gate_check(rec)
    if not gate["passes"]:
        if not rec["allow_blind_task"]:
            w = get_kind(cfg).words
            raise common.StudyError(
                f"{what}: the {w.start_long} does not clearly read the {w.prompt}: "
                f"{'; '.join(gate['reasons'])} ({w.blind} guesser: {w.blind_note}; "
                f"{os.path.join(sft_dir, VALIDITY)}). A comparison there measures guessing: "
                f"choose a task / start where the start reads the {w.prompt}, or set "
                f"--config.{OVERRIDE} for a documented exploration (recorded in the outputs)")
        logging.warning("%s: %s; running anyway (%s: a documented exploration)", what,
                        gate["line"], OVERRIDE)
    return rec


__all__ = ["OVERRIDE", "VALIDITY", "blind_choice", "check_validity", "gate_check", "read_validity",
           "require_readable", "sft_validity", "validity_line", "validity_record",
           "validity_settings"]
