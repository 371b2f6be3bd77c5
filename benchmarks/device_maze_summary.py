r"""One JSON of a maze study workdir, for the device command (`benchmarks/device_run.sh`):
the SFT start's held-out pass@k beside the maze-blind control's (`sera_jax.studies.paired.blind`),
every arm's evaluation curve (pass@k, per-maze correct counts) and per-step training log,
the stage timings and the comparison table when the eval stage finished. Works on a partial
workdir (a stage cut by its budget): what is missing is said, not guessed.

    python benchmarks/device_maze_summary.py --config=configs/maze/gpu17.py \
        --workdir=/tmp/maze_gpu --out=$OUT/maze.json
"""

from __future__ import annotations

import json
import os
from typing import Any

from absl import app, flags

from sera_jax import config_files
from sera_jax.records import read_json, read_jsonl
from sera_jax.studies.paired.kinds import maze as blind
from sera_jax.studies.paired.spec import build_task

_CONFIG = flags.DEFINE_string("config", "configs/maze/gpu17.py", "The study's config file.")
_WORKDIR = flags.DEFINE_string("workdir", None, "The study's workdir.", required=True)
_OUT = flags.DEFINE_string("out", None, "Where to write the JSON.", required=True)

#: Per-step training fields kept (the rest of train.jsonl stays on the machine).
TRAIN_FIELDS = ("step", "reward_mean", "mixed_fraction", "rollouts_min", "rollouts_max",
                "kappa_min", "kappa_mean", "generated_tokens", "truncated_fraction", "loss",
                "grad_norm", "finite", "step_time", "sample_time", "train_time", "tokens_per_s")


def summarise(config_path: str, workdir: str) -> dict[str, Any]:
    """The summary dict (see the module docstring)."""
    cfg = config_files.get_config(config_path)
    task = build_task(cfg)
    ks = [2 ** i for i in range(int(cfg.eval.num_samples).bit_length())]
    out: dict[str, Any] = {"config": config_path, "name": cfg.name, "task": task.describe(),
                           "model": cfg.model.to_dict(), "missing": []}
    out["blind"] = blind.task_validity(task, "eval", int(cfg.eval.num_prompts), ks)
    sft_eval = os.path.join(workdir, "sft", "eval.json")
    if os.path.exists(sft_eval):
        start = read_json(sft_eval)
        final = start.get("value", start).get("final", {})
        out["start"] = {"pass_at_k": final.get("pass_at_k"), "num_samples":
                        final.get("num_samples"), "num_correct": final.get("num_correct")}
        b, s = out["blind"]["blind_pass_at_k"], final.get("pass_at_k", {})
        out["start_over_blind"] = {k: (s[k] / b[k] if b.get(k) else None) for k in s}
    else:
        out["missing"].append("sft/eval.json (SFT stage did not finish)")
    out["sft_train"] = read_jsonl(os.path.join(workdir, "sft", "train.jsonl"))
    out["runs"] = {}
    rl_dir = os.path.join(workdir, "rl")
    for arm in sorted(os.listdir(rl_dir)) if os.path.isdir(rl_dir) else []:
        for seed_dir in sorted(os.listdir(os.path.join(rl_dir, arm))):
            d = os.path.join(rl_dir, arm, seed_dir)
            train = read_jsonl(os.path.join(d, "train.jsonl"))
            out["runs"][f"{arm}/{seed_dir}"] = {
                "steps_done": max((r["step"] for r in train), default=0),
                "eval": read_jsonl(os.path.join(d, "eval.jsonl")),
                "train": [{k: r.get(k) for k in TRAIN_FIELDS} for r in train]}
    out["timings"] = read_jsonl(os.path.join(workdir, "timings.jsonl"))
    comparison = os.path.join(workdir, "results", "comparison.json")
    if os.path.exists(comparison):
        out["comparison"] = read_json(comparison)
    else:
        out["missing"].append("results/comparison.json (eval stage did not finish)")
    return out


def main(argv: list[str]) -> None:
    del argv
    summary = summarise(_CONFIG.value, _WORKDIR.value)
    with open(_OUT.value, "w") as f:
        json.dump(summary, f)
    start = (summary.get("start") or {}).get("pass_at_k") or {}
    print(f"maze summary -> {_OUT.value}; blind held-out pass@k "
          f"{ {k: round(v, 4) for k, v in summary['blind']['blind_pass_at_k'].items()} }; "
          f"start {({k: round(v, 4) for k, v in start.items()})}; runs "
          f"{ {r: v['steps_done'] for r, v in summary['runs'].items()} }; missing "
          f"{summary['missing']}")


if __name__ == "__main__":
    app.run(main)
