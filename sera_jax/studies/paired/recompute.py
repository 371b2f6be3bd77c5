"""Recompute every number of an exported paired comparison from its files alone.

`recompute(folder)` reads `results/<kind>/<name>/` (`export`): the per-prompt correct counts of
`counts.npz`, `config.json` and `export.json`, and rebuilds with the aggregator's own functions
(`report.build_table`, `frontier.point` / `summarise`, `matched.endpoint_from_curves`):

* the comparison table: every pass@k (recomputed from the counts as the evaluation does,
  `metrics.pass_at_k_curve`), the blind control (from the per-prompt `blind_q`), the validity
  check, paired differences, noise floors (unpaired and paired), the null control, the
  curve analysis (Δ(t), primary endpoint with both intervals, secondaries, gate, A/A);
* the frontier's points, gates, selected lr and distances with their CIs;
* the matched arms' endpoints with their verdicts (`matched.json`, `norm_matched.json`)
  and the norm rule's update-norm ratios, r and the achieved one with their CIs, from the
  per-seed update norms its output records (`matched.rederive_norm`).

Only the fields that are not functions of the counts are read from `comparison.json`: the
runs' generated rollouts / tokens, training reward and allocator diagnostics (`RUN_FIELDS`,
per seed) and the per-step diagnostics. `compare_numbers` lists every number that differs.

Bad input is one line (`main`: `error: <file>: <what is wrong>; <fix>`, exit status 1),
never a traceback: a missing or empty folder, a missing, empty, truncated or non-JSON file,
a `counts.npz` that is not a NumPy archive (read with `allow_pickle=False`: nothing in an
export is ever unpickled), files that do not belong together. `load_export` first checks
every file against the SHA-256 that `export.json` lists for it, so a folder mixing two
exports (or a file changed after the export) is named before anything is computed; an export
written before the manifest listed hashes is read with a note that its files are unverified.
"""

from __future__ import annotations

import json
import os
import sys
import zipfile
import zlib
from collections.abc import Mapping
from typing import Any

import ml_collections
import numpy as np

from sera_jax.loop import canonical
from sera_jax.metrics import pass_at_k_curve
from sera_jax.studies import common
from sera_jax.studies import compare as cmp
from sera_jax.studies.paired import frontier as fr
from sera_jax.studies.paired import matched as mt
from sera_jax.studies.paired.evaluation import pass1_distribution
from sera_jax.studies.paired.export import COUNTS, EXPORT_FILES, MANIFEST, sha256_file
from sera_jax.studies.paired.frontier import frontier_markdown
from sera_jax.studies.paired.kinds.base import blind_pass_at_k
from sera_jax.studies.paired.outcomes import OUTCOMES_FILE
from sera_jax.studies.paired.prereg import PREREGISTRATION
from sera_jax.studies.paired.report import (
    RUN_FIELDS,
    START_ROWS,
    build_table,
    outcome_summary,
    registered_gate,
)
from sera_jax.studies.paired.tables import comparison_markdown
from sera_jax.studies.paired.validity import check_validity, validity_settings


def _record(counts: Mapping[str, np.ndarray], key: str, n: int) -> dict[str, Any] | None:
    """An evaluation record (num_correct, num_samples, pass_at_k, train, test) from the
    counts."""
    if f"{key}/eval" not in counts:
        return None

    def one(c: np.ndarray) -> dict[str, Any]:
        c = np.asarray(c, np.int64)
        ks, values = pass_at_k_curve(np.full(c.size, n), c)
        return {"num_samples": n, "num_correct": c.tolist(),
                "pass_at_k": {str(int(k)): float(v) for k, v in zip(ks, values)}}

    rec = one(counts[f"{key}/eval"])
    for split in ("train", "test"):
        if f"{key}/{split}" in counts:
            rec[split] = one(counts[f"{key}/{split}"])
    return rec


def _curve(counts: Mapping[str, np.ndarray], key: str, n: int) -> dict[int, dict] | None:
    if f"{key}/curve_steps" not in counts:
        return None
    steps = counts[f"{key}/curve_steps"].tolist()
    out = {}
    for i, t in enumerate(steps):
        rec = {"eval": counts[f"{key}/curve/eval"][i]}
        for split in ("train", "test"):
            if f"{key}/curve/{split}" in counts:
                rec[split] = counts[f"{key}/curve/{split}"][i]
        out[int(t)] = _record({f"p/{s}": v for s, v in rec.items()}, "p", n)
    return out


def load_data(cfg: ml_collections.ConfigDict, counts: Mapping[str, np.ndarray],
              table: Mapping[str, Any] | None, prefix: str = "",
              sft_points: dict | None = None) -> dict[str, Any]:
    """`report.gather`'s data rebuilt from the counts (`prefix`: a frontier lr's or the
    matched arm's), the non-count fields taken from `table` (comparison.json) when given."""
    n, c_n = int(cfg.eval.num_samples), int(cfg.eval.curve_samples)
    points = sft_points
    if points is None:
        points = {}
        for key in counts:
            if key.startswith("sft/") and key.endswith("/eval"):
                step, size, keys = (int(x) for x in key.split("/")[1].split("_"))
                points[(step, size, keys)] = _record(counts, key[:-len("/eval")], size)
        # The start's answer length and truncation are recorded, not counted: from the table.
        start = (table or {}).get("sft", {})
        final = points.get((int(cfg.rl.num_steps), n, int(cfg.eval.seed)))
        if final is not None:
            final.update(mean_length=start.get("answer_length"),
                         truncated_fraction=start.get("truncated_fraction"))
    runs: dict[str, dict[int, Any]] = {}
    order = list(table["methods"]) if table else []
    found = sorted({k.split("/")[len(prefix.split("/"))] for k in counts
                    if k.startswith(f"{prefix}run/")})
    for arm in order + [a for a in found if a not in order]:
        entry = (table or {}).get("methods", {}).get(arm, {})
        seeds = entry.get("seeds") or sorted({int(k.split("/")[len(prefix.split("/")) + 1])
                                              for k in counts
                                              if k.startswith(f"{prefix}run/{arm}/")})
        diags = ((table or {}).get("curves", {}).get("diagnostics", {}).get("per_seed", {})
                 .get(arm, {}))
        runs[arm] = {}
        for i, seed in enumerate(seeds):
            key = f"{prefix}run/{arm}/{seed}"
            runs[arm][int(seed)] = {
                "final": _record(counts, f"{key}/final", n),
                "curve": _curve(counts, key, c_n),
                "noise": _record(counts, f"{key}/noise", n),
                "fields": {f: (entry[f]["values"][i] if entry.get(f) else None)
                           for f in RUN_FIELDS},
                "diagnostics": diags.get(str(seed), [])}
    final0 = points[(0, n, int(cfg.eval.seed))]
    return {"points": points, "runs": runs,
            "sft_eval": {"pass1_distribution": pass1_distribution(final0["num_correct"], n)},
            "preregistered": bool((table or {}).get("primary", {}).get("preregistered")),
            "validity": None}


def recompute_validity(cfg: ml_collections.ConfigDict, counts: Mapping[str, np.ndarray],
                       saved: Mapping[str, Any]) -> dict[str, Any]:
    """The validity record: blind pass@k from `blind_q`, the start's from its counts, the
    check; the descriptive fields (distinct answers, path) from `saved`. The sealed test
    split's block (`blind_q_test`, the start's test counts) likewise when `saved` has one,
    and the override read on the gate's split (`gate_split`)."""
    s = validity_settings(cfg)
    n = int(cfg.eval.num_samples)
    ks = sorted(set(cmp.ks_for(n)) | {s["k"]})

    def one(blind_q: np.ndarray, split: str, block: Mapping[str, Any]) -> dict[str, Any]:
        blind = blind_pass_at_k(blind_q, ks)
        start_c = counts[f"sft/0_{n}_{int(cfg.eval.seed)}/{split}"]
        v = cmp.per_prompt_pass_at_k(np.asarray(start_c), n, ks).mean(axis=-1)
        start = {str(k): float(x) for k, x in zip(ks, v)}
        check = check_validity(start, blind, s["k"], s["pass1_ratio"], s["blind_share"])
        return {**block, **check, "blind_pass_at_k": blind, "start_pass_at_k": start,
                "override": bool(s["allow_blind_task"] and not check["passes"])}

    out = one(counts["blind_q"], "eval", saved)
    if "test" in saved:
        out["test"] = one(counts["blind_q_test"], "test", saved["test"])
        if saved.get("gate_split") == "test":
            out["override"] = out["test"]["override"]
    return out


class ExportError(common.StudyError):
    """An export folder or file that cannot be recomputed (the message names it)."""


#: The fix named by every refusal of a damaged export file.
_RESTORE = "restore the folder from git (git checkout -- <folder>) or export it again"


def read_export_json(folder: str, name: str, kind: type = dict) -> Any:
    """`folder/name` parsed, or one ExportError naming the file and what is wrong with it."""
    path = os.path.join(folder, name)
    if not os.path.isfile(path):
        raise ExportError(f"{path}: missing; an export folder holds {MANIFEST}, config.json, "
                          f"comparison.json and {COUNTS} (--stage=export writes them)")
    try:
        with open(path, "rb") as f:
            raw = f.read()
        if not raw.strip():
            raise ExportError(f"{path}: empty (a truncated copy?); {_RESTORE}")
        obj = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise ExportError(f"{path}: not UTF-8 text (byte {e.start}): not a file of an export; "
                          f"{_RESTORE}") from None
    except json.JSONDecodeError as e:
        raise ExportError(f"{path}: not valid JSON (line {e.lineno}, column {e.colno}: "
                          f"{e.msg}): truncated or corrupt; {_RESTORE}") from None
    except OSError as e:
        raise ExportError(f"{path}: cannot be read ({e.strerror or e})") from None
    if not isinstance(obj, kind):
        raise ExportError(f"{path}: a JSON {type(obj).__name__}, not the {kind.__name__} an "
                          f"export writes; {_RESTORE}")
    return obj


def read_counts(path: str) -> dict[str, np.ndarray]:
    """The arrays of `counts.npz`, read with `allow_pickle=False`; one ExportError naming
    the file for a missing, empty, truncated or non-NumPy file or an object array."""
    if not os.path.isfile(path):
        raise ExportError(f"{path}: missing; {_RESTORE}")
    if os.path.getsize(path) == 0:
        raise ExportError(f"{path}: empty (a truncated copy?); {_RESTORE}")
    try:
        z = np.load(path, allow_pickle=False)
        if not hasattr(z, "files"):
            raise ExportError(f"{path}: one array, not the .npz archive of per-prompt "
                              f"counts an export writes; {_RESTORE}")
        with z:
            return {k: z[k] for k in z.files}
    except ExportError:
        raise
    except ValueError as e:
        what = ("holds Python objects (an export holds only numbers; it is not unpickled)"
                if "pickle" in str(e) else f"not a NumPy archive ({e})")
        raise ExportError(f"{path}: {what}; {_RESTORE}") from None
    except (zipfile.BadZipFile, zlib.error, EOFError, OSError, KeyError) as e:
        raise ExportError(f"{path}: truncated or corrupt ({type(e).__name__}: "
                          f"{str(e)[:200]}); {_RESTORE}") from None


def check_files(folder: str, manifest: Mapping[str, Any]) -> list[str]:
    """Check the export's files against the SHA-256 its manifest lists (ExportError naming
    the first that differs, is missing, or is an export file the manifest does not list: a
    folder mixing two exports); returns notes (an export without hashes: unverified)."""
    listed = manifest.get("files")
    if listed is None:
        return [f"note: {os.path.join(folder, MANIFEST)} lists no file hashes (an export "
                "written before they existed): its files are not verified against it"]
    if not isinstance(listed, Mapping) or not all(
            isinstance(v, Mapping) and isinstance(v.get("sha256"), str)
            for v in listed.values()):
        raise ExportError(f"{os.path.join(folder, MANIFEST)}: 'files' is not "
                          f"{{file: {{bytes, sha256}}}}; {_RESTORE}")
    for name, entry in sorted(listed.items()):
        path = os.path.join(folder, name)
        if not os.path.isfile(path):
            raise ExportError(f"{path}: missing, but {MANIFEST} lists it; {_RESTORE}")
        if sha256_file(path) != entry["sha256"]:
            raise ExportError(
                f"{path}: its SHA-256 differs from the one {MANIFEST} lists: the file was "
                f"changed after the export or belongs to another export (a folder mixing two "
                f"studies); {_RESTORE}")
    strays = sorted(f for f in EXPORT_FILES if f not in listed
                    and os.path.exists(os.path.join(folder, f)))
    if strays:
        raise ExportError(
            f"{folder}: {', '.join(strays)} {'is' if len(strays) == 1 else 'are'} not in "
            f"{MANIFEST}'s file list: left from another export (a folder mixing two studies); "
            "move them away or export the study again into a clean folder")
    return []


def load_export(folder: str) -> dict[str, Any]:
    """The export in `folder`, checked before anything is computed: {cfg, manifest,
    comparison (the saved table), counts, notes}. ExportError naming the folder or file."""
    if not os.path.isdir(folder):
        raise ExportError(f"{folder}: no such folder; pass an export folder, e.g. "
                          "results/maze/maze_cpu_read")
    if not any(os.path.exists(os.path.join(folder, f)) for f in (MANIFEST, *EXPORT_FILES)):
        raise ExportError(f"{folder}: not an export folder (it holds none of {MANIFEST}, "
                          "config.json, comparison.json, counts.npz); pass the folder "
                          "--stage=export wrote, e.g. results/maze/maze_cpu_read")
    manifest = read_export_json(folder, MANIFEST)
    notes = check_files(folder, manifest)
    for key, kind in (("methods", list), ("curve_analysis", bool)):
        if not isinstance(manifest.get(key), kind):
            raise ExportError(f"{os.path.join(folder, MANIFEST)}: field {key!r} is "
                              f"{'missing' if key not in manifest else repr(manifest[key])}, "
                              f"not a {kind.__name__}; {_RESTORE}")
    config = read_export_json(folder, "config.json")
    for field in ("name", "eval", "compare", "rl"):
        if field not in config:
            raise ExportError(f"{os.path.join(folder, 'config.json')}: no {field!r} field: "
                              f"not the config of a paired study; {_RESTORE}")
    if manifest.get("config") is not None and manifest["config"] != config["name"]:
        raise ExportError(
            f"{folder}: {MANIFEST} is the export of {manifest['config']!r} but config.json is "
            f"{config['name']!r}'s: the folder mixes two studies; {_RESTORE}")
    saved = read_export_json(folder, "comparison.json")
    counts = read_counts(os.path.join(folder, COUNTS))
    return {"cfg": ml_collections.ConfigDict(config), "manifest": manifest,
            "comparison": saved, "counts": counts, "notes": notes}


def recompute(folder: str) -> dict[str, Any]:
    """{"comparison": table, "frontier": out | None, "matched" / "norm_matched": {result,
    ...} | None (`recompute_matched`), "notes"} rebuilt from the export in `folder` (module
    docstring); ExportError for a folder or file that is not a whole export
    (`load_export`)."""
    export = load_export(folder)
    cfg, manifest, saved, counts = (export[k] for k in ("cfg", "manifest", "comparison",
                                                        "counts"))
    data = load_data(cfg, counts, saved)
    if saved.get("validity") is not None:
        data["validity"] = recompute_validity(cfg, counts, saved["validity"])
    table = build_table(cfg, data, manifest["methods"], manifest["curve_analysis"])
    if "preregistration" in saved:
        table["preregistration"] = saved["preregistration"]
    prereg_file = os.path.join(folder, PREREGISTRATION)
    if manifest["curve_analysis"] and "gate" in table and os.path.exists(prereg_file):
        registered = registered_gate(cfg, data, manifest["methods"],
                                     read_export_json(folder, PREREGISTRATION))
        if registered is not None:
            table["gate_registered"] = registered
    out: dict[str, Any] = {"comparison": table, "frontier": None, "matched": None,
                           "notes": export["notes"]}
    fpath = os.path.join(folder, "frontier.json")
    if os.path.exists(fpath):
        fsaved = read_export_json(folder, "frontier.json")
        k, window = int(fsaved["k"]), int(fsaved["window"])
        split = str(fsaved.get("split", "eval"))  # the primary's split (held-out before it)
        level = float(cfg.compare.level)
        fout = {key: fsaved[key] for key in fsaved if key not in (
            "lrs", "sft", "blind", "sft_eval", "blind_eval", "selected_lr", "admissible",
            "above_baseline_frontier", "above_baseline_frontier_ci")}
        fout["lrs"] = {}
        for name, e in fsaved["lrs"].items():
            lcfg = fr.lr_config(cfg, e["lr"])
            ldata = load_data(lcfg, counts, None, f"frontier/{name}/", data["points"])
            ldata["validity"] = data["validity"]
            lr_methods = e.get("methods", fsaved["methods"])
            ltable = build_table(lcfg, ldata, lr_methods)
            pts = fr.lr_points(ltable, lr_methods + ([fr.NULL] if lcfg.compare.null else []),
                               k, window, level, split)
            fout["lrs"][name] = {"lr": e["lr"], "dir": e["dir"], **pts,
                                 "gate": ltable["gate"],
                                 **{key: e[key] for key in ("methods", "seeds", "method_seeds")
                                    if key in e}}
            if "sft" not in fout:
                fout.update(fr.start_points(ltable, k, window, split))
        fout.update(fr.summarise(fout, cfg.compare.baseline, k))
        out["frontier"] = fout
    for rule in mt.RULES.values():  # the matched arms: {"result", ...rule.rederive}
        out[rule.stage] = recompute_matched(folder, rule, cfg, counts, data)
    out["outcomes"] = None
    if os.path.exists(os.path.join(folder, OUTCOMES_FILE)):  # per-sample classes
        arrays = read_counts(os.path.join(folder, OUTCOMES_FILE))
        # through JSON, as saved: integer seeds become keys of strings
        out["outcomes"] = json.loads(json.dumps(outcome_summary(cfg, arrays)))
    out["start_temperatures"] = None
    if os.path.exists(os.path.join(folder, START_ROWS)):  # pass@k from the saved counts
        rows = read_export_json(folder, START_ROWS)
        out["start_temperatures"] = {t: {**r, "pass_at_k": {
            str(int(k)): float(v) for k, v in zip(*pass_at_k_curve(
                np.full(len(r["num_correct"]), r["num_samples"]),
                np.asarray(r["num_correct"])))}} for t, r in rows.items()}
    return out


def recompute_matched(folder: str, rule: mt.Rule, cfg: ml_collections.ConfigDict,
                      counts: Mapping[str, np.ndarray], data: Mapping[str, Any]
                      ) -> dict[str, Any] | None:
    """A matched arm's endpoint (`matched.endpoint_from_curves`) from the counts of its runs
    at the derived lr (`<stage>/run/...`) and of the comparison's runs at the config's lr,
    with the rule's other numbers (`rule.rederive`); None without its `<stage>.json` or
    when its arm has not run."""
    name = f"{rule.stage}.json"
    if not os.path.exists(os.path.join(folder, name)):
        return None
    m = read_export_json(folder, name)
    if not m.get("result", {}).get("ran"):
        return None
    mcfg = mt.matched_config(cfg, m["choice"]["lr"])
    mdata = load_data(mcfg, counts, None, f"{rule.stage}/", data["points"])
    derived = rule.arms(m)[0]
    curves = {arm: {s: r["curve"] for s, r in (mdata if arm == derived else data)["runs"].get(
        arm, {}).items()} for arm in (m["method"], m["baseline"])}
    result = mt.endpoint_from_curves(mcfg, curves[m["method"]], curves[m["baseline"]],
                                     m["seeds"], m["endpoint"].get("split", "eval"))
    return {"result": result, **(rule.rederive(cfg, m) if rule.rederive else {})}


def saved_view(saved: Mapping[str, Any], got: Mapping[str, Any]) -> dict[str, Any]:
    """What a matched arm's recomputation is checked against: the saved `result` whole, and
    of every other part the keys `got` rebuilds."""
    return {k: saved.get(k) if k == "result" else
            {f: (saved.get(k) or {}).get(f) for f in v} for k, v in got.items()}


def _numbers(x: Any, path: str = "") -> dict[str, Any]:
    if isinstance(x, Mapping):
        out = {}
        for k, v in x.items():
            out.update(_numbers(v, f"{path}/{k}"))
        return out
    if isinstance(x, list | tuple):
        out = {}
        for i, v in enumerate(x):
            out.update(_numbers(v, f"{path}[{i}]"))
        return out
    return {path: x}


#: Leaves that describe a method in words (how a CI was computed, what a control is), not a
#: result: their wording may change between versions (e.g. "prompts" for "mazes"); every
#: number, verdict, name and outcome is compared.
DESCRIPTIONS = ("note", "ci_method", "band_method", "two_level/method")
#: Verdicts renamed since older exports were written (saved -> what the code says now):
#: an interval that holds 0 is "inconclusive", never "no difference" (`compare.verdict`).
LEGACY_VERDICTS = {"no difference": "inconclusive"}


def compare_numbers(recomputed: Any, saved: Any, tol: float = 0.0) -> list[str]:
    """Paths (and values) of every leaf of `saved` that `recomputed` lacks or differs on
    (numbers: by more than `tol`; the wording of `DESCRIPTIONS` leaves is not compared; a
    saved `verdict` leaf is read through `LEGACY_VERDICTS`); JSON round trip first (tuples,
    int keys). Leaves only `recomputed` has (fields added since the export) are not
    differences."""
    a, b = _numbers(canonical(recomputed)), _numbers(canonical(saved))
    bad = []
    for path, v in b.items():
        if path.endswith(tuple("/" + d for d in DESCRIPTIONS)) and isinstance(v, str):
            continue
        if path.endswith("/verdict") and isinstance(v, str):
            v = LEGACY_VERDICTS.get(v, v)
        w = a.get(path, "<missing>")
        same = (abs(w - v) <= tol if isinstance(v, int | float) and isinstance(w, int | float)
                and not isinstance(v, bool) else w == v)
        if not same:
            bad.append(f"{path}: recomputed {w!r}, saved {v!r}")
    return bad


def main(folder: str) -> int:
    """Print the recomputed tables and the check against the saved JSON (exit status 1 on a
    difference); a folder or file that is not a whole export, or files that do not fit
    together, is one line on stderr (`error: ...`) and exit status 1, never a traceback."""
    try:
        return _main(folder)
    except common.StudyError as e:
        print(f"error: {e}", file=sys.stderr)
    except (KeyError, IndexError, TypeError, ValueError, AttributeError) as e:
        print(f"error: {folder}: the export's files do not fit together ({type(e).__name__}: "
              f"{str(e)[:200]}): a file of another study or of another version; {_RESTORE}",
              file=sys.stderr)
    return 1


def _main(folder: str) -> int:
    out = recompute(folder)
    for note in out["notes"]:
        print(note)
    print(comparison_markdown(out["comparison"]))
    status = 0
    checks = [("comparison", out["comparison"], "comparison.json")]
    if out["frontier"] is not None:
        print(frontier_markdown(out["frontier"]))
        checks.append(("frontier", out["frontier"], "frontier.json"))
    checks += [(rule.stage, out[rule.stage], f"{rule.stage}.json")
               for rule in mt.RULES.values() if out[rule.stage] is not None]
    if out["outcomes"] is not None:
        checks.append(("outcomes", out["outcomes"], "outcomes.json"))
    if out["start_temperatures"] is not None:
        checks.append(("start_temperatures", out["start_temperatures"], START_ROWS))
    for name, got, file in checks:
        saved = read_export_json(folder, file)
        saved = (saved_view(saved, got) if name in mt.RULES else
                 {k: v for k, v in saved.items() if k != "preregistration"})
        bad = compare_numbers(got, saved, tol=1e-12)
        count = len(_numbers(saved))
        print(f"{name}: {count - len(bad)} of {count} saved values recomputed equal"
              + ("" if not bad else "; differ:\n  " + "\n  ".join(bad[:20])))
        status |= bool(bad)
    return status


__all__ = ["ExportError", "check_files", "compare_numbers", "load_data", "load_export", "main",
           "read_counts", "read_export_json", "recompute", "recompute_matched",
           "recompute_validity", "saved_view"]
