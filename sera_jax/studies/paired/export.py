"""Raw results export (`--stage=export`): everything a reader needs to recompute the
comparison (and frontier, and lr- and norm-matched) numbers, under
`results/<kind>/<config name>/`:

* `comparison.json`, `frontier.json` / `matched.json` / `norm_matched.json` /
  `mechanism.json` (when the workdir has them) and `preregistration.json` (a copy, when the
  committed file lives elsewhere);
* `config.json` (the config as run), `export.json` (the methods, seeds and lrs exported) and
  `sft_validity.json` (the start's `sft/validity.json`: the blind control's report);
* `counts.npz`: per-prompt correct counts, int16, compressed -- the SFT start at every scoring
  (`sft/<step>_<n>_<keys>/<split>`), every run's final point, curve points `[T, M]` and
  noise-key scoring (`run/<arm>/<seed>/{final,curve,noise}/<split>`), the same per frontier
  lr (`frontier/<lr>/run/...`) and for the matched arms' runs at their derived lr
  (`matched/run/...`, `norm_matched/run/...`), and the blind control's per-prompt success
  probability (`blind_q`). `<split>` is `eval`, `train`
  when training prompts are scored and `test` when the sealed test split is (whose blind
  control is `blind_q_test`);
* with `eval.outcomes`, `outcomes.npz` (each sample's class and length, int8 / uint16,
  compressed: `outcomes.outcome_arrays`, with `templates/<split>`) and `outcomes.json`
  (format vs correctness, `report.write_outcomes`).

`sera_jax.studies.paired.recompute` rebuilds the tables from these files alone.

The export is atomic and owned (`export_results`): it is written into a fresh folder beside
the target and moved into place, so a failed export leaves the previous one whole and a
re-export replaces every exported file (none of an earlier export is left beside the new
ones; files no export writes, such as a hand-written `stamp.json`, are kept and named in the
log). A folder holding another study's export -- another config name, or a config hash that
is neither this config's nor one its pre-registration's amendments registered -- is refused,
naming both. `export.json` names the config and its hash and lists every file with its size
and SHA-256 (`recompute` checks them before it reads anything). Paths inside the exported
JSON are relative to the repository (the pre-registration) or to the workdir (the start's
validity report), never a machine's absolute folder. `--stage=export` also refuses a
pre-registration that is not committed in git (`prereg.require_committed`).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from typing import Any

import ml_collections
import numpy as np
from absl import logging

from sera_jax.records import read_json
from sera_jax.studies import common
from sera_jax.studies.paired import frontier as fr
from sera_jax.studies.paired import matched as mt
from sera_jax.studies.paired.outcomes import OUTCOMES_FILE
from sera_jax.studies.paired.prereg import (
    PREREGISTRATION,
    comparison_hashes,
    preregistration_path,
    read_preregistration,
    registered,
)
from sera_jax.studies.paired.report import START_ROWS, gather, outcome_inputs
from sera_jax.studies.paired.spec import comparison_spec, repo_path, repo_root, results_dir
from sera_jax.studies.paired.validity import VALIDITY

COUNTS = "counts.npz"
MANIFEST = "export.json"
#: Every file an export may write besides its manifest (`MANIFEST`).
EXPORT_FILES = ("comparison.json", "frontier.json", "matched.json", "norm_matched.json",
                PREREGISTRATION,
                "sft_validity.json", "config.json", COUNTS, "mechanism.json",
                "frontier_mechanism.json", "outcomes.json", OUTCOMES_FILE, START_ROWS)


def _put(arrays: dict[str, np.ndarray], key: str, rec: Mapping[str, Any] | None) -> None:
    """A record's held-out (training, sealed test) counts under `key/eval` (`key/train`,
    `key/test`)."""
    if rec is None:
        return
    arrays[f"{key}/eval"] = np.asarray(rec["num_correct"], np.int16)
    for split in ("train", "test"):
        if split in rec:
            arrays[f"{key}/{split}"] = np.asarray(rec[split]["num_correct"], np.int16)


def data_arrays(data: Mapping[str, Any], prefix: str = "", sft: bool = True
                ) -> dict[str, np.ndarray]:
    """`report.gather`'s counts as flat arrays (module docstring's keys, under `prefix`)."""
    out: dict[str, np.ndarray] = {}
    if sft:
        for (step, n, keys), rec in data["points"].items():
            _put(out, f"{prefix}sft/{step}_{n}_{keys}", rec)
    for arm, runs in data["runs"].items():
        for seed, r in runs.items():
            key = f"{prefix}run/{arm}/{seed}"
            _put(out, f"{key}/final", r["final"])
            _put(out, f"{key}/noise", r["noise"])
            if r["curve"]:
                steps = sorted(r["curve"])
                out[f"{key}/curve_steps"] = np.asarray(steps, np.int32)
                _put(out, f"{key}/curve", {
                    "num_correct": [r["curve"][t]["num_correct"] for t in steps],
                    **{split: {"num_correct": [r["curve"][t][split]["num_correct"]
                                               for t in steps]}
                       for split in ("train", "test") if split in r["curve"][steps[0]]}})
    return out


def sha256_file(path: str) -> str:
    """SHA-256 hex digest of the file at `path`."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def portable_paths(obj: Any, workdir: str, prereg: str | None = None,
                   prereg_copy: str | None = None) -> Any:
    """`obj` (JSON) with every absolute path under a `"path"` key made machine-free: the
    pre-registration `prereg` -> its exported copy `prereg_copy`; a file of the repository ->
    relative to it; of the workdir -> relative to the workdir; anything else -> its name."""
    if isinstance(obj, Mapping):
        out = {}
        for k, v in obj.items():
            if k == "path" and isinstance(v, str) and os.path.isabs(v):
                v = os.path.abspath(v)
                if prereg and v == os.path.abspath(prereg) and prereg_copy:
                    v = repo_path(prereg_copy)
                elif v.startswith(repo_root() + os.sep):
                    v = repo_path(v)
                elif v.startswith(os.path.abspath(workdir) + os.sep):
                    v = os.path.relpath(v, os.path.abspath(workdir))
                else:
                    v = os.path.basename(v)
                out[k] = v
            else:
                out[k] = portable_paths(v, workdir, prereg, prereg_copy)
        return out
    if isinstance(obj, list):
        return [portable_paths(v, workdir, prereg, prereg_copy) for v in obj]
    return obj


def export_owner(folder: str) -> dict[str, Any] | None:
    """{"config", "config_hash" (None when unknown)} of the export in `folder`, from its
    manifest (or, for an export written before manifests named them, its `config.json`);
    None when `folder` holds no export."""
    manifest_path = os.path.join(folder, MANIFEST)
    config_path = os.path.join(folder, "config.json")
    if not os.path.exists(manifest_path) and not any(
            os.path.exists(os.path.join(folder, f)) for f in ("comparison.json", COUNTS)):
        return None
    try:
        manifest = read_json(manifest_path) if os.path.exists(manifest_path) else {}
        config = read_json(config_path) if os.path.exists(config_path) else {}
    except (OSError, ValueError) as e:
        raise common.StudyError(
            f"{folder} holds an export whose {MANIFEST} / config.json cannot be read "
            f"({type(e).__name__}: {e}): move the folder away, then export again") from None
    if not isinstance(manifest, dict) or not isinstance(config, dict):
        raise common.StudyError(f"{folder} holds files that are not an export of this "
                                "project: move the folder away, then export again")
    name = manifest.get("config", config.get("name"))
    digest = manifest.get("config_hash")
    if digest is None and config:
        try:  # an export from before manifests named the hash: its config's
            digest = comparison_spec(ml_collections.ConfigDict(config))["config_hash"]
        except Exception:  # noqa: BLE001 -- a config of an older schema: the name decides
            digest = None
    return {"config": name, "config_hash": digest}


def check_owner(cfg: ml_collections.ConfigDict, folder: str) -> None:
    """Refuse (StudyError naming both) to export `cfg` into `folder` when it holds the
    export of another config -- another config name, or a config hash that is neither `cfg`'s
    nor one its pre-registration registered (the original section or an amendment) -- or
    the pre-registration of another study."""
    name, digest = str(cfg.get("name", "")), comparison_spec(cfg)["config_hash"]
    prereg = preregistration_path(cfg)
    owner = export_owner(folder)
    if owner is not None:
        ours = {digest}
        if os.path.exists(prereg):
            hashes = comparison_hashes(read_preregistration(prereg))
            if digest in hashes:
                ours |= set(hashes)
        if owner["config"] != name or (owner["config_hash"] is not None
                                       and owner["config_hash"] not in ours):
            raise common.StudyError(
                f"{folder} holds the export of another study (config {owner['config']!r}, "
                f"hash {str(owner['config_hash'])[:12]}...), not of this one (config "
                f"{name!r}, hash {digest[:12]}...): refusing to overwrite it. Export under "
                "this config's own name (--config.name), or move that folder away first")
    there = os.path.join(folder, PREREGISTRATION)
    if os.path.exists(there) and os.path.abspath(there) != os.path.abspath(prereg):
        try:
            same = (os.path.exists(prereg) and registered(read_json(there))
                    == registered(read_preregistration(prereg)))
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            same = False
        if not same:
            raise common.StudyError(
                f"{folder} holds the pre-registration of another study ({there}), not the one "
                f"of config {name!r} ({prereg}): refusing to overwrite it. Export under this "
                "config's own name (--config.name), or into another folder")


def _write_json(path: str, obj: Any) -> None:
    """`obj` as JSON at `path` (inside the export's private temporary folder)."""
    with open(path, "w") as f:
        json.dump(obj, f, indent=1)


def _swap(new: str, target: str, parent: str) -> None:
    """Move folder `new` to `target`, replacing the folder there as a whole: the old one is
    first moved aside (and put back if the move fails), then deleted."""
    if not os.path.exists(target):
        os.rename(new, target)
        return
    aside = tempfile.mkdtemp(prefix=f".{os.path.basename(target)}.old-", dir=parent)
    os.rename(target, os.path.join(aside, "export"))
    try:
        os.rename(new, target)
    except OSError:
        os.rename(os.path.join(aside, "export"), target)
        os.rmdir(aside)
        raise
    shutil.rmtree(aside, ignore_errors=True)


def export_results(cfg: ml_collections.ConfigDict, workdir: str,
                   methods: Sequence[str] | None = None, seeds: Sequence[int] | None = None,
                   out_dir: str | None = None) -> dict[str, Any]:
    """Write the export (module docstring) of the workdir's finished comparison to `out_dir`
    (default `<repo>/results/<kind>/<config.name>/`): refused when `out_dir` holds another
    study's export (`check_owner`); written into a fresh folder beside it, then moved into
    place. Returns {dir, files, bytes, kept}."""
    results = os.path.join(workdir, "results")
    if not os.path.exists(os.path.join(results, "comparison.json")):
        raise common.StudyError(f"no {os.path.join(results, 'comparison.json')}: run "
                                "--stage=eval before --stage=export")
    out_dir = os.path.abspath(out_dir or results_dir(cfg))
    check_owner(cfg, out_dir)
    methods = list(methods or common.method_names(cfg.compare.methods, "compare.methods"))
    seeds = list(seeds or common.int_list(cfg.compare.seeds, "compare.seeds"))
    sft_dir = os.path.join(workdir, "sft")
    curve = cfg.compare.get("primary") is not None
    # Everything is read before anything is written.
    data = gather(cfg, workdir, methods, seeds, sft_dir, curve_analysis=curve)
    arrays = data_arrays(data)
    per_sample = outcome_inputs(cfg, data)  # eval.outcomes: each sample's class
    validity = read_json(os.path.join(sft_dir, VALIDITY))
    arrays["blind_q"] = np.asarray(validity["blind_q"], np.float64)
    if "test" in validity:  # the sealed test split's blind control
        arrays["blind_q_test"] = np.asarray(validity["test"]["blind_q"], np.float64)
    manifest: dict[str, Any] = {"config": str(cfg.get("name", "")),
                                "config_hash": comparison_spec(cfg)["config_hash"],
                                "methods": methods, "seeds": seeds, "curve_analysis": curve}
    prereg = preregistration_path(cfg)
    prereg_copy = os.path.join(out_dir, PREREGISTRATION) if os.path.exists(prereg) else None
    jsons = {"comparison.json": read_json(os.path.join(results, "comparison.json"))}
    if per_sample:
        jsons["outcomes.json"] = read_json(os.path.join(results, "outcomes.json"))
    if os.path.exists(os.path.join(results, START_ROWS)):
        jsons[START_ROWS] = read_json(os.path.join(results, START_ROWS))
    if os.path.exists(os.path.join(results, "mechanism.json")):  # `mechanism.write_summary`
        jsons["mechanism.json"] = read_json(os.path.join(results, "mechanism.json"))
    if os.path.exists(os.path.join(results, "frontier.json")):
        fout = jsons["frontier.json"] = read_json(os.path.join(results, "frontier.json"))
        manifest["frontier"] = {"methods": fout["methods"], "seeds": fout["seeds"],
                                "lrs": {name: e["lr"] for name, e in fout["lrs"].items()}}
        # every lr's mechanism summary (`stage_frontier` writes frontier/lr<lr>/results/)
        mech = {name: read_json(path) for name in fout["lrs"] if os.path.exists(
            path := os.path.join(workdir, "frontier", f"lr{name}", "results", "mechanism.json"))}
        if mech:
            jsons["frontier_mechanism.json"] = {"lrs": mech}
        for name, e in fout["lrs"].items():
            lcfg = fr.lr_config(cfg, e["lr"])
            ldata = gather(lcfg, os.path.join(workdir, e["dir"]),
                           e.get("methods", fout["methods"]), e.get("seeds", fout["seeds"]),
                           sft_dir, method_seeds=e.get("method_seeds"))
            arrays.update(data_arrays(ldata, f"frontier/{name}/", sft=False))
    for rule in mt.RULES.values():  # the matched arms: their runs at the derived lr
        name = f"{rule.stage}.json"
        if os.path.exists(os.path.join(results, name)):
            mout = jsons[name] = read_json(os.path.join(results, name))
            if mout.get("dir"):
                mcfg = mt.matched_config(cfg, mout["choice"]["lr"])
                mdata = gather(mcfg, os.path.join(workdir, mout["dir"]), [rule.arms(mout)[0]],
                               mout["seeds"], sft_dir)
                arrays.update(data_arrays(mdata, f"{rule.stage}/", sft=False))
    # The start's validity report (blind control, distinct answers) beside the counts.
    jsons["sft_validity.json"] = validity
    jsons["config.json"] = cfg.to_dict()
    parent = os.path.dirname(out_dir)
    try:
        os.makedirs(parent, exist_ok=True)
        tmp = tempfile.mkdtemp(prefix=f".{os.path.basename(out_dir)}.export-", dir=parent)
    except OSError as e:
        raise common.StudyError(f"cannot write the export into {out_dir}: {parent} is not "
                                f"writable ({e.strerror or e}); export to a writable results "
                                "folder (fix its permissions)") from None
    try:
        files = []
        for name, obj in jsons.items():
            _write_json(os.path.join(tmp, name),
                        portable_paths(obj, workdir, prereg, prereg_copy))
            files.append(name)
        if prereg_copy:
            shutil.copyfile(prereg, os.path.join(tmp, PREREGISTRATION))
            files.append(PREREGISTRATION)
        np.savez_compressed(os.path.join(tmp, COUNTS), **arrays)
        files.append(COUNTS)
        if per_sample:
            np.savez_compressed(os.path.join(tmp, OUTCOMES_FILE), **per_sample)
            files.append(OUTCOMES_FILE)
        manifest["files"] = {f: {"bytes": os.path.getsize(os.path.join(tmp, f)),
                                 "sha256": sha256_file(os.path.join(tmp, f))}
                             for f in sorted(files)}
        _write_json(os.path.join(tmp, MANIFEST), manifest)
        # Files no export writes (a hand-written stamp) stay, named in the log.
        kept = sorted(f for f in (os.listdir(out_dir) if os.path.isdir(out_dir) else [])
                      if f not in EXPORT_FILES and f != MANIFEST)
        for f in kept:
            src = os.path.join(out_dir, f)
            (shutil.copytree if os.path.isdir(src) else shutil.copy2)(
                src, os.path.join(tmp, f))
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o777 & ~umask)  # mkdtemp's folder is private
        _swap(tmp, out_dir, parent)
    except OSError as e:
        shutil.rmtree(tmp, ignore_errors=True)
        raise common.StudyError(f"cannot write the export into {out_dir}: "
                                f"{e.strerror or e} ({getattr(e, 'filename', None) or tmp}); "
                                "nothing was replaced: fix the folder's permissions or free "
                                "space, then export again") from None
    if kept:
        logging.warning("%s: kept %s (not written by the export): check that it still "
                        "describes this export", out_dir, ", ".join(kept))
    files.append(MANIFEST)
    size = sum(os.path.getsize(os.path.join(out_dir, f)) for f in files)
    return {"dir": out_dir, "files": files, "bytes": size, "kept": kept}


__all__ = ["COUNTS", "EXPORT_FILES", "MANIFEST", "check_owner", "data_arrays",
           "export_owner", "export_results", "portable_paths", "sha256_file"]
