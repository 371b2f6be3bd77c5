"""Raw results export (`--stage=export`): everything a reader needs to recompute the
comparison (and frontier, and lr-matched) numbers, under `results/<kind>/<config name>/`:

* `comparison.json`, `frontier.json` / `matched.json` (when the workdir has them) and
  `preregistration.json` (a copy, when the committed file lives elsewhere);
* `config.json` (the config as run), `export.json` (the methods, seeds and lrs exported) and
  `sft_validity.json` (the start's `sft/validity.json`: the blind control's report);
* `counts.npz`: per-prompt correct counts, int16, compressed -- the SFT start at every scoring
  (`sft/<step>_<n>_<keys>/<split>`), every run's final point, curve points `[T, M]` and
  noise-key scoring (`run/<arm>/<seed>/{final,curve,noise}/<split>`), the same per frontier
  lr (`frontier/<lr>/run/...`) and for the matched arm (`matched/run/...`), and the
  blind control's per-prompt success probability (`blind_q`).

`sera_jax.studies.paired.recompute` rebuilds the tables from these files alone.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping, Sequence
from typing import Any

import ml_collections
import numpy as np

from sera_jax.records import read_json, write_json
from sera_jax.studies import common
from sera_jax.studies.paired import frontier as fr
from sera_jax.studies.paired import matched as mt
from sera_jax.studies.paired.prereg import preregistration_path
from sera_jax.studies.paired.report import gather
from sera_jax.studies.paired.spec import results_dir
from sera_jax.studies.paired.validity import VALIDITY

COUNTS = "counts.npz"


def _put(arrays: dict[str, np.ndarray], key: str, rec: Mapping[str, Any] | None) -> None:
    """A record's held-out (and training) counts under `key/eval` (`key/train`)."""
    if rec is None:
        return
    arrays[f"{key}/eval"] = np.asarray(rec["num_correct"], np.int16)
    if "train" in rec:
        arrays[f"{key}/train"] = np.asarray(rec["train"]["num_correct"], np.int16)


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
                    **({"train": {"num_correct": [r["curve"][t]["train"]["num_correct"]
                                                  for t in steps]}}
                       if "train" in r["curve"][steps[0]] else {})})
    return out


def export_results(cfg: ml_collections.ConfigDict, workdir: str,
                   methods: Sequence[str] | None = None, seeds: Sequence[int] | None = None,
                   out_dir: str | None = None) -> dict[str, Any]:
    """Write the export (module docstring) of the workdir's finished comparison to `out_dir`
    (default `<repo>/results/<kind>/<config.name>/`); returns {dir, files, bytes}."""
    results = os.path.join(workdir, "results")
    if not os.path.exists(os.path.join(results, "comparison.json")):
        raise common.StudyError(f"no {os.path.join(results, 'comparison.json')}: run "
                                "--stage=eval before --stage=export")
    out_dir = out_dir or results_dir(cfg)
    os.makedirs(out_dir, exist_ok=True)
    methods = list(methods or common.method_names(cfg.compare.methods, "compare.methods"))
    seeds = list(seeds or common.int_list(cfg.compare.seeds, "compare.seeds"))
    sft_dir = os.path.join(workdir, "sft")
    curve = cfg.compare.get("primary") is not None
    data = gather(cfg, workdir, methods, seeds, sft_dir, curve_analysis=curve)
    arrays = data_arrays(data)
    validity = read_json(os.path.join(sft_dir, VALIDITY))
    arrays["blind_q"] = np.asarray(validity["blind_q"], np.float64)
    manifest: dict[str, Any] = {"methods": methods, "seeds": seeds, "curve_analysis": curve}
    files = ["comparison.json"]
    shutil.copyfile(os.path.join(results, "comparison.json"),
                    os.path.join(out_dir, "comparison.json"))
    if os.path.exists(os.path.join(results, "frontier.json")):
        fout = read_json(os.path.join(results, "frontier.json"))
        shutil.copyfile(os.path.join(results, "frontier.json"),
                        os.path.join(out_dir, "frontier.json"))
        files.append("frontier.json")
        manifest["frontier"] = {"methods": fout["methods"], "seeds": fout["seeds"],
                                "lrs": {name: e["lr"] for name, e in fout["lrs"].items()}}
        for name, e in fout["lrs"].items():
            lcfg = fr.lr_config(cfg, e["lr"])
            ldata = gather(lcfg, os.path.join(workdir, e["dir"]),
                           e.get("methods", fout["methods"]), e.get("seeds", fout["seeds"]),
                           sft_dir)
            arrays.update(data_arrays(ldata, f"frontier/{name}/", sft=False))
    if os.path.exists(os.path.join(results, "matched.json")):
        mout = read_json(os.path.join(results, "matched.json"))
        shutil.copyfile(os.path.join(results, "matched.json"),
                        os.path.join(out_dir, "matched.json"))
        files.append("matched.json")
        if mout.get("dir"):
            mcfg = mt.matched_config(cfg, mout["choice"]["lr"])
            mdata = gather(mcfg, os.path.join(workdir, mout["dir"]), [mout["baseline"]],
                           mout["seeds"], sft_dir)
            arrays.update(data_arrays(mdata, "matched/", sft=False))
    prereg = preregistration_path(cfg)
    if os.path.exists(prereg):
        target = os.path.join(out_dir, "preregistration.json")
        if os.path.abspath(prereg) != os.path.abspath(target):
            shutil.copyfile(prereg, target)
        files.append("preregistration.json")
    # The start's validity report (blind control, distinct answers) beside the counts.
    shutil.copyfile(os.path.join(sft_dir, VALIDITY), os.path.join(out_dir, "sft_validity.json"))
    files.append("sft_validity.json")
    write_json(os.path.join(out_dir, "config.json"), cfg.to_dict())
    write_json(os.path.join(out_dir, "export.json"), manifest)
    np.savez_compressed(os.path.join(out_dir, COUNTS), **arrays)
    files += ["config.json", "export.json", COUNTS]
    size = sum(os.path.getsize(os.path.join(out_dir, f)) for f in files)
    return {"dir": out_dir, "files": files, "bytes": size}


__all__ = ["COUNTS", "data_arrays", "export_results"]
