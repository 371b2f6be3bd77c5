r"""Math pilot (`experiments/math_pilot.py`): how well does the start policy do on candidate
task mixes, at the RL sampler?

Before RL can measurably learn on the CPU, the start policy's held-out pass@1 should be
roughly 10-40 % with headroom at large k, and its answers short enough that few hit the token
cap. For each named candidate (`CANDIDATES`: generator templates and step counts, prompt
template, answer cap) this loads the policy of `--config` once (the math kind:
`sera_jax.studies.paired.kinds.lm`) and scores it with the paired study's evaluation
(`sera_jax.studies.paired.evaluation.evaluate_policy`, the keys of evaluation point 0) on the
first `eval.num_prompts` held-out problems x `eval.num_samples` samples at the RL sampler's
temperature / top-p (`rl.sampling`), then prints pass@1 / pass@n, maj@n, truncation, mean
answer length (tokens) and seconds per candidate. The model and every candidate's task block
are validated (`lm.validate_model` / `lm.validate_task`) before anything loads.

    python -m experiments.math_pilot --config=configs/math/cpu.py --workdir=runs/math_pilot \
        --candidates=plain32,number24_s1 --config.eval.num_prompts=32 --config.eval.num_samples=8

Each candidate's record is `<workdir>/<name>.json` (the evaluation record plus the sampler,
three example completions, the candidate's fields and the split sizes) with the fingerprint
of what it measured (`fingerprint`: the model, the candidate's task, the evaluation and the
sampler); a finished candidate with the same fingerprint is not re-run, so a killed command
continues where it stopped. A record made with other settings (another `eval.num_prompts`,
model, sampler ...) is recomputed, and the run says so, naming the changed fields; an empty
`--candidates` is refused. The task sizes are 128 train /
128 held-out problems (generator seed `task.seed`), or 96 / 96 where the templates cannot
supply 128 (add, mul).
"""

from __future__ import annotations

import copy
import os
import time
from typing import Any

import ml_collections
import numpy as np

from sera_jax import loop
from sera_jax.records import read_json, write_json
from sera_jax.studies import common
from sera_jax.studies.paired.evaluation import evaluate_policy
from sera_jax.studies.paired.kinds import lm
from sera_jax.studies.paired.spec import build_model, build_task, eval_sampling, make_mesh
from sera_jax.tasks.mathqa.task import load_splits

_BARE = "bare_add,bare_sub,bare_mul"
_SMALL = "small_add,small_sub,small_mul"
_STEPS2 = "chain_addsub,chain_subadd,mul_add,mul_sub"
_SMALL2 = "small_chain_addsub,small_chain_subadd,small_mul_add,small_mul_sub"

#: name -> task overrides (on the config's `task` block).
CANDIDATES: dict[str, dict[str, Any]] = {
    # The current CPU default's wording (one-step add/mul asked plainly), cap 32.
    "plain32": dict(steps=(1,), templates="add,mul", template="none", max_new_tokens=32),
    # One-step add/mul, "Answer with the number only.", cap 16.
    "number16_addmul": dict(steps=(1,), templates="add,mul", template="number",
                            max_new_tokens=16),
    # All one-step templates (add, sub, mul, div), number only, cap 16.
    "number16_s1": dict(steps=(1,), templates="", template="number", max_new_tokens=16),
    # All one-step templates asked plainly, cap 32.
    "plain32_s1": dict(steps=(1,), templates="", template="none", max_new_tokens=32),
    # All one-step templates, number only, cap 24.
    "number24_s1": dict(steps=(1,), templates="", template="number", max_new_tokens=24),
    # Bare arithmetic ("What is 48 + 23?", "What is 52 - 33?", "What is 17 x 2?"), number
    # only, cap 16, stopping at the first newline token.
    "bare16_nl": dict(steps=(1,), templates=_BARE, template="number", max_new_tokens=16,
                      stop_at_newline=True),
    # The same at cap 12.
    "bare12_nl": dict(steps=(1,), templates=_BARE, template="number", max_new_tokens=12,
                      stop_at_newline=True),
    # Bare add / sub only (no two-digit x one-digit products), cap 16, newline stop.
    "bare16_nl_addsub": dict(steps=(1,), templates="bare_add,bare_sub", template="number",
                             max_new_tokens=16, stop_at_newline=True),
    # Control: bare arithmetic at cap 16 without the newline stop.
    "bare16": dict(steps=(1,), templates=_BARE, template="number", max_new_tokens=16),
    # Small bare arithmetic (numbers up to 25, times tables to 12 x 9), cap 16, newline stop.
    "small16_nl": dict(steps=(1,), templates=_SMALL, template="number", max_new_tokens=16,
                       stop_at_newline=True),
    # The same at cap 8 (an answer of up to 3 digits and its newline fits).
    "small8_nl": dict(steps=(1,), templates=_SMALL, template="number", max_new_tokens=8,
                      stop_at_newline=True),
    # The same at cap 24.
    "small24_nl": dict(steps=(1,), templates=_SMALL, template="number", max_new_tokens=24,
                       stop_at_newline=True),
    # Issue 49: two-step bare arithmetic (a + b - c, a - b + c, a x b + c, a x b - c) with a
    # format-ready start: four worked examples as earlier chat turns ("14 + 23 = 37, and
    # 37 - 9 = 28. The answer is 28."), one line (newline stop), cap 40.
    "steps2_fs": dict(steps=(2,), templates=_STEPS2, template="worked", fewshot="steps",
                      max_new_tokens=40, stop_at_newline=True),
    # The same with two-digit x one-digit products (one step) in the mix.
    "steps2_fs_bmul": dict(steps=(1, 2), templates=_STEPS2 + ",bare_mul", template="worked",
                           fewshot="steps", max_new_tokens=40, stop_at_newline=True),
    # Control: the same problems asked for the number only, no examples (format not ready).
    "steps2_number": dict(steps=(2,), templates=_STEPS2, template="number", fewshot="",
                          max_new_tokens=24, stop_at_newline=True),
    # Two-step word problems (bags, wage, more_than) beside the bare ones, the same examples.
    "steps2_fs_word": dict(steps=(2,), templates=_STEPS2 + ",bags,wage,more_than",
                           template="worked", fewshot="steps", max_new_tokens=48,
                           stop_at_newline=True),
    # The two-step mix with small numbers, the same examples and format.
    "small2_fs": dict(steps=(2,), templates=_SMALL2, template="worked", fewshot="steps",
                      max_new_tokens=40, stop_at_newline=True),
    # The small mix with the short worked line ("7 x 6 = 42, 42 + 15 = 57"), cap 24.
    "small2_short": dict(steps=(2,), templates=_SMALL2, template="steps",
                         fewshot="steps_short", max_new_tokens=24, stop_at_newline=True),
    # The same at cap 32 (cap 24 cut 9 % of the lines: two-digit steps take 23-25 tokens).
    "small2_short32": dict(steps=(2,), templates=_SMALL2, template="steps",
                           fewshot="steps_short", max_new_tokens=32, stop_at_newline=True),
    # The two-digit mix with the short worked line, cap 24.
    "steps2_short": dict(steps=(2,), templates=_STEPS2, template="steps",
                         fewshot="steps_short", max_new_tokens=24, stop_at_newline=True),
    # Both mixes together (half small, half two-digit).
    "mixed2_fs": dict(steps=(2,), templates=_SMALL2 + "," + _STEPS2, template="worked",
                      fewshot="steps", max_new_tokens=40, stop_at_newline=True),
}
#: Problems per split, the first one the candidate's templates supply (the pilot wants
#: >= 128 train and >= 128 held-out).
SPLIT_SIZES = (128, 96, 64)


def candidate_config(cfg: ml_collections.ConfigDict, name: str) -> ml_collections.ConfigDict:
    """`cfg` with candidate `name`'s task overrides, the most problems per split of
    `SPLIT_SIZES` the templates can supply (add/mul has ~110 held-out contents), the RL
    sampler's temperature / top-p for the evaluation and no training-problem scoring."""
    c = copy.deepcopy(cfg)
    with c.unlocked():  # optional task fields (`fewshot`) may be new to the config
        for field, value in CANDIDATES[name].items():
            c.task[field] = value
    for size in SPLIT_SIZES:
        c.task.num_train = c.task.num_eval = size
        try:
            load_splits(c.task)
            break
        except ValueError:
            continue
    c.eval.temperature, c.eval.top_p = c.rl.sampling.temperature, c.rl.sampling.top_p
    c.eval.top_k, c.eval.max_new_tokens = 0, 0
    c.eval.train_prompts = 0  # held-out problems only
    with c.unlocked():  # each sample's class (correct / wrong / no answer / truncated)
        c.eval.outcomes = True
    return c


def fingerprint(c: ml_collections.ConfigDict) -> dict[str, Any]:
    """What a candidate's record measures (its config `c`): the model, the task, the
    evaluation (its batch size left out: it changes no number) and the RL sampler."""
    ev = {k: v for k, v in c.eval.to_dict().items() if k != "batch_size"}
    return loop.canonical({"model": c.model.to_dict(), "task": c.task.to_dict(), "eval": ev,
                           "sampling": c.rl.sampling.to_dict()})


def cached_record(path: str, fp: dict[str, Any]) -> tuple[dict[str, Any] | None, str]:
    """(`path`'s record, "") when it was made with fingerprint `fp`; else (None, why it is
    recomputed: the changed fields, no fingerprint, or an unreadable file)."""
    try:
        record = read_json(path)
    except (OSError, ValueError) as e:
        return None, f"unreadable ({type(e).__name__})"
    if not isinstance(record, dict) or "fingerprint" not in record:
        return None, "made before records carried their settings"
    changed = loop.changed_fields(record["fingerprint"], fp)
    if changed:
        return None, "made with other settings (" + ", ".join(changed[:8]) + (
            f", ... {len(changed) - 8} more" if len(changed) > 8 else "") + ")"
    return record, ""


def evaluate_candidate(model: Any, task: Any, c: ml_collections.ConfigDict, mesh: Any,
                       examples: int = 3) -> dict[str, Any]:
    """The start scored on candidate config `c` (`evaluate_policy` at point 0) with the
    sampler's settings and `examples` decoded completions (`lm.sample_examples`)."""
    record = evaluate_policy(model, task, c, int(c.eval.num_samples), 0, mesh)
    sampling = eval_sampling(c, task)
    record["maj_at_n"] = record.pop("maj")
    record.update(num_prompts=min(int(c.eval.num_prompts), task.split_size("eval")),
                  temperature=float(sampling.temperature), top_p=float(sampling.top_p),
                  max_new_tokens=int(sampling.max_new_tokens))
    if examples:
        record["examples"] = lm.sample_examples(model, task, c, mesh, examples)
    return record


def run(cfg: ml_collections.ConfigDict, workdir: str, candidates: list[str]) -> dict[str, Any]:
    """Evaluate the start policy on each named candidate (resuming finished ones from
    `<workdir>/<name>.json`); returns {"records", "summary" (markdown)}. Every candidate's
    config is checked before the model loads."""
    candidates = [c for c in candidates if c.strip()]
    if not candidates:
        raise common.StudyError(f"--candidates is empty: name at least one of "
                                f"{sorted(CANDIDATES)} (or leave the flag out: all of them)")
    unknown = sorted(set(candidates) - set(CANDIDATES))
    if unknown:
        raise common.StudyError(f"--candidates: unknown {unknown}; known: {sorted(CANDIDATES)}")
    lm.validate_model(cfg)
    for field in ("num_samples", "num_prompts", "batch_size"):
        common.check(common.positive_int(cfg.eval[field]), f"eval.{field}", cfg.eval[field],
                     "an integer >= 1")
    configs = {name: candidate_config(cfg, name) for name in candidates}
    for c in configs.values():
        lm.validate_task(c)
    workdir = common.prepare_workdir(workdir)
    model, mesh = None, make_mesh(cfg)
    records = {}
    for name, c in configs.items():
        path = os.path.join(workdir, f"{name}.json")
        fp = fingerprint(c)
        if os.path.exists(path):
            cached, why = cached_record(path, fp)
            if cached is not None:
                records[name] = cached
                continue
            print(f"{name}: recomputing {path}: its record was {why}", flush=True)
        if model is None:
            t0 = time.perf_counter()
            model = build_model(c, mesh)
            print(f"model loaded in {time.perf_counter() - t0:.0f} s", flush=True)
        task = build_task(c)
        record = evaluate_candidate(model, task, c, mesh)
        record.update(candidate=name, task=dict(CANDIDATES[name]),
                      num_train=task.split_size("train"), num_eval=task.split_size("eval"),
                      prompt_len_max=int(task.max_prompt_len), fingerprint=fp)
        write_json(path, record)
        records[name] = record
        print(table({name: record}), flush=True)
    return {"records": records, "summary": table(records)}


def table(records: dict[str, dict]) -> str:
    """Markdown: one row per candidate (percent; length in tokens; seconds of evaluation)."""
    lines = ["| candidate | train / held-out | pass@1 | pass@n | maj@n | truncated | "
             "parseable | p < 1/8 | mean length | eval s |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for name, r in records.items():
        n = str(r["num_samples"])
        maj = "–" if r["maj_at_n"] is None else f"{100 * r['maj_at_n']:.1f}"
        frac = r.get("outcome_fractions")
        parse = "–" if frac is None else f"{100 * (frac['correct'] + frac['wrong']):.1f}%"
        low = np.mean(np.asarray(r["num_correct"]) / int(n) < 1 / 8)
        lines.append(
            f"| {name} | {r['num_train']} / {r['num_eval']} | "
            f"{100 * r['pass_at_k']['1']:.1f} | {100 * r['pass_at_k'][n]:.1f} (n={n}) | {maj} "
            f"| {100 * r['truncated_fraction']:.1f}% | {parse} | {100 * low:.0f}% "
            f"| {r['mean_length']:.1f} | {r['seconds']:.0f} |")
    return "\n".join(lines) + "\n"


__all__ = ["CANDIDATES", "SPLIT_SIZES", "cached_record", "candidate_config",
           "evaluate_candidate", "fingerprint", "run", "table"]
