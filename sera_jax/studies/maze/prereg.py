"""The committed pre-registration (issue 37): `results/maze/<config name>/preregistration.json`.

Written by `--stage=preregister` (`write_preregistration`) and committed to the repository
before any RL run, it holds, per section:

* `comparison`: the primary endpoint (`curves.primary_spec`) and `config_hash`, the SHA-256
  of the comparison-relevant fields (`comparison_fields`: every arm's resolved run config
  with the task, model, SFT and evaluation it uses -- the fields that only say how long a
  log / checkpoint interval is, the mesh and the RL seed left out -- and `config.compare`,
  the validity thresholds filled with their defaults), the fields themselves beside it so a
  difference can be named;
* `frontier` (configs with a `frontier` section): its metric, k, window, lr grid, methods,
  seeds, the lr selection rule, the rule for SERA's distance above uniform's frontier, the
  lr-matched arm's rule and endpoint (`matched.MATCH_RULE`), and the hash of every lr's
  comparison fields;
* `lr_matched` (added by `--stage=matched` from the frontier's results, before the arm
  runs): the lr the rule chose and the numbers it read.

`check_preregistration` (stages rl / compare / all / frontier / matched) refuses to start when
the file is missing or its endpoint or hash differs from the config; `check_primary` (the
aggregator) refuses a primary endpoint that differs from the file. `compare.preregistration`
(default '': the path above) points elsewhere (tests, explorations).
"""

from __future__ import annotations

import datetime
import hashlib
import json
import os
import subprocess
from typing import Any

import ml_collections

from sera_jax import loop
from sera_jax.records import read_json, write_json
from sera_jax.studies import common
from sera_jax.studies.maze import lm
from sera_jax.studies.maze.curves import primary_spec
from sera_jax.studies.maze.setup import arms, rl_fingerprint, run_config
from sera_jax.studies.maze.validity import VALIDITY_DEFAULTS

PREREGISTRATION = "preregistration.json"
#: Run-fingerprint fields that do not change what a run computes (cadence, layout, seed).
OMIT = ("start", "rl.seed", "rl.log_every", "rl.checkpoint_every", "rl.max_checkpoints_to_keep",
        "rl.multihost", "rl.async_checkpoint", "rl.mesh", "eval.batch_size")
#: `config.compare` fields that say where the record lives, not what it records.
COMPARE_OMIT = ("preregistration",)


def repo_root() -> str:
    """The repository holding this package (`results/` lives there)."""
    return os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
        os.path.abspath(__file__)))))


def preregistration_path(cfg: ml_collections.ConfigDict) -> str:
    """`compare.preregistration`, or
    `<repo>/results/<maze|math>/<config.name>/preregistration.json` (`lm.study_name`)."""
    path = cfg.compare.get("preregistration", "") or ""
    return os.path.abspath(path) if path else os.path.join(
        repo_root(), "results", lm.study_name(cfg), str(cfg.get("name", "maze")),
        PREREGISTRATION)


def comparison_fields(cfg: ml_collections.ConfigDict) -> dict[str, Any]:
    """What defines the comparison: each arm's run fingerprint (`setup.rl_fingerprint` with
    `OMIT` left out) and `config.compare` (validity defaults filled, `COMPARE_OMIT` out)."""
    methods = common.method_names(cfg.compare.methods, "compare.methods")
    seeds = common.int_list(cfg.compare.seeds, "compare.seeds")
    compare = {**VALIDITY_DEFAULTS, **loop.canonical(cfg.compare.to_dict())}
    for key in COMPARE_OMIT:
        compare.pop(key, None)
    return {"arms": arm_fields(cfg, methods, seeds), "compare": compare}


def arm_fields(cfg: ml_collections.ConfigDict, methods: list[str], seeds: list[int]
               ) -> dict[str, Any]:
    """{arm: its run fingerprint without `OMIT`} for the arms of `methods` x `seeds`."""
    return {arm: loop.trim_fields(rl_fingerprint(cfg, run_config(cfg, arm, 0), 0), OMIT)
            for arm, _ in arms(cfg, methods, seeds)}


def fields_hash(fields: Any) -> str:
    """SHA-256 of the canonical JSON of `fields` (sorted keys)."""
    text = json.dumps(loop.canonical(fields), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def comparison_spec(cfg: ml_collections.ConfigDict) -> dict[str, Any]:
    """The `comparison` section: primary endpoint, config hash and the hashed fields."""
    fields = comparison_fields(cfg)
    return {"primary": primary_spec(cfg), "config_hash": fields_hash(fields), "fields": fields}


def frontier_spec(cfg: ml_collections.ConfigDict) -> dict[str, Any]:
    """The `frontier` section (module docstring)."""
    from sera_jax.studies.maze import frontier as fr  # imports this module
    from sera_jax.studies.maze import matched

    p, base = cfg.compare.primary, cfg.compare.baseline
    lrs = fr.frontier_learning_rates(cfg)
    methods, seeds = fr.frontier_methods(cfg), fr.frontier_seeds(cfg)
    fields = {f"{lr:g}": arm_fields(fr.lr_config(cfg, lr), *fr.lr_arms(cfg, lr)) for lr in lrs}
    own = float(cfg.rl.optimizer.learning_rate)
    return {"metric": f"held-out pass@1 and pass@{int(p.k)}, per seed the mean over the last "
                      f"{int(p.window)} evaluation points", "k": int(p.k),
            "window": int(p.window), "learning_rates": lrs,
            "methods": methods, "seeds": seeds,
            "at_config_lr": ({"lr": own, **dict(zip(("methods", "seeds"), fr.lr_arms(cfg, own)))}
                             if own in lrs else None),
            "null": bool(cfg.frontier.null),
            "null_seeds": common.int_list(cfg.frontier.null_seeds, "frontier.null_seeds"),
            "selection_rule": fr.SELECTION_RULE.format(base=base, k=int(p.k)),
            "distance_rule": fr.DISTANCE_RULE.format(k=int(p.k)),
            "matched": matched.matched_spec(cfg),
            "config_hash": fields_hash(fields)}


def _sections(cfg: ml_collections.ConfigDict) -> dict[str, Any]:
    out = {"comparison": comparison_spec(cfg)}
    if "frontier" in cfg:
        out["frontier"] = frontier_spec(cfg)
    return out


def write_preregistration(cfg: ml_collections.ConfigDict) -> dict[str, Any]:
    """Write (or confirm) the pre-registration of `cfg` at `preregistration_path`; a file
    whose sections differ from the config is refused, never overwritten (returns the
    record with its `path`)."""
    path = preregistration_path(cfg)
    sections = _sections(cfg)
    saved = read_json(path) if os.path.exists(path) else {}
    for name, spec in sections.items():
        if name in saved and loop.canonical(saved[name]) != loop.canonical(spec):
            raise common.StudyError(
                f"{path} pre-registers another {name} than this config "
                f"({_differences(saved[name], spec)}); a pre-registration is never rewritten: "
                "keep the config, or, if no RL run has used it, delete the file deliberately "
                "(git rm) and run --stage=preregister again, then commit it")
    record = {"config": str(cfg.get("name", "")), **saved, **sections}
    record.setdefault("written", datetime.date.today().isoformat())
    record.setdefault("note", "commit this file before any RL run; the study refuses to run "
                              "or aggregate a comparison whose endpoint or config differs")
    if record != saved:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        write_json(path, record)
    return {**record, "path": path}


def _differences(saved: dict[str, Any], spec: dict[str, Any]) -> str:
    changed = loop.changed_fields(saved, spec)
    shown = [c for c in changed if not c.endswith("config_hash")][:8]
    return "changed: " + (", ".join(shown) if shown else "config_hash")


def git_committed(path: str) -> bool | None:
    """Whether `path` is tracked by git with no uncommitted change (None: git cannot tell)."""
    where = os.path.dirname(path)
    try:
        tracked = subprocess.run(["git", "-C", where, "ls-files", "--error-unmatch", path],
                                 capture_output=True, timeout=20)
        if tracked.returncode != 0:
            return False
        clean = subprocess.run(["git", "-C", where, "diff", "--quiet", "HEAD", "--", path],
                               capture_output=True, timeout=20)
        return clean.returncode == 0
    except (OSError, subprocess.SubprocessError):
        return None


def check_preregistration(cfg: ml_collections.ConfigDict, section: str = "comparison"
                          ) -> dict[str, Any]:
    """Refuse (StudyError naming the file and the fix) unless the pre-registration exists and
    its `section` equals the config's; returns {path, found, committed, hash_matches}."""
    path = preregistration_path(cfg)
    fix = (f"write it with `python -m experiments.maze --config=<{cfg.get('name', '')} config>"
           " --stage=preregister` and commit it before any RL run")
    if not os.path.exists(path):
        raise common.StudyError(f"no pre-registration at {path}: {fix}")
    saved = read_json(path)
    spec = comparison_spec(cfg) if section == "comparison" else frontier_spec(cfg)
    if section not in saved:
        raise common.StudyError(f"{path} has no {section!r} section: {fix}")
    if loop.canonical(saved[section]) != loop.canonical(spec):
        raise common.StudyError(
            f"the config's {section} differs from its pre-registration {path} "
            f"({_differences(saved[section], spec)}): run the pre-registered config, or "
            "pre-register a new config under its own name (a new config.name)")
    committed = git_committed(path)
    return {"path": path, "found": True, "committed": committed, "hash_matches": True,
            "primary_matches": True}


def check_primary(cfg: ml_collections.ConfigDict) -> dict[str, Any]:
    """The aggregator's check: a primary endpoint that differs from the pre-registration's is
    refused; a missing file or a changed config hash is recorded, not refused."""
    path = preregistration_path(cfg)
    if not os.path.exists(path) or "comparison" not in read_json(path):
        return {"path": path, "found": False}
    saved = read_json(path)["comparison"]
    spec = comparison_spec(cfg)
    if loop.canonical(saved["primary"]) != loop.canonical(spec["primary"]):
        raise common.StudyError(
            f"compare.primary / baseline / gate {spec['primary']} differ from the "
            f"pre-registered primary endpoint in {path}: {saved['primary']}; the primary "
            "cannot change after the pre-registration (read the other endpoint among the "
            "secondary ones)")
    return {"path": path, "found": True, "committed": git_committed(path),
            "primary_matches": True, "hash_matches": saved["config_hash"] == spec["config_hash"],
            "config_hash": saved["config_hash"]}


__all__ = ["PREREGISTRATION", "check_preregistration", "check_primary", "comparison_fields",
           "comparison_spec", "arm_fields", "fields_hash", "frontier_spec", "git_committed",
           "preregistration_path", "repo_root", "write_preregistration"]
