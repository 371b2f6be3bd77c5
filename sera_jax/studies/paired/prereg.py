"""The committed pre-registration: `results/<kind>/<config name>/preregistration.json`.

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
  comparison fields; `frontier.method_seeds` and `frontier.margin` (with the frontier gap's
  rule, `spec.GAP_RULE`) only when set (`compare.margin` is in `config.compare`, hashed
  only when set), so the files written before them still hold;
* `lr_matched` (added by `--stage=matched` from the frontier's results, before the arm
  runs): the lr the rule chose and the numbers it read;
* `norm_matched` (added by `--stage=norm_matched` from the comparison's runs; the arm runs
  only once the file holding it is committed): the rule (`spec.NORM_MATCH_RULE`), the arm
  and its endpoint (`spec.norm_matched_spec`), the measured update norms, their ratio r
  with its CI, the derived lr, and `config_hash`, the SHA-256 of the rest of the section
  (checked on every read);
* `amendments` (added by `--stage=amend`, each before the runs it adds): a dated list of
  control-arm growths -- `compare.null_seeds` / `compare.aa_seeds` may only gain seeds, with
  the primary endpoint and every other comparison field unchanged -- each with its reason
  (`compare.amendment`), the fields it changed (old and new) and the amended config hash.
  A config matches the pre-registration when its comparison equals the original section or
  an amendment's (`comparison_hashes`); the report names every amendment with its date.

`check_preregistration` (stages rl / compare / all / frontier / matched) refuses to start when
the file is missing or its endpoint or hash differs from the config; `check_primary` (the
aggregator) refuses a primary endpoint that differs from the file. `compare.preregistration`
(default '': the path above) points elsewhere (tests, explorations).

The file is read as data (`read_preregistration`): a missing or malformed field is one
StudyError naming the file and the field. A file git does not hold as committed (untracked,
staged only, or modified: `git_committed`) is logged and reported as "not committed in git" in
every table, and `--stage=export` refuses it (`require_committed`). Every amendment says why
in its own words: a reason equal to an earlier amendment's is refused.
"""

from __future__ import annotations

import datetime
import os
import re
import subprocess
from typing import Any

import ml_collections
from absl import logging

from sera_jax import loop
from sera_jax.records import read_json, write_json
from sera_jax.studies import common
from sera_jax.studies.paired.kinds import get_kind
from sera_jax.studies.paired.spec import (
    comparison_spec,
    fields_hash,
    frontier_spec,
    repo_path,
    results_dir,
)

PREREGISTRATION = "preregistration.json"
#: The comparison fields an amendment may change, and only by adding seeds (control arms:
#: more of them narrow the gate's seed-level band without touching the primary endpoint).
AMENDABLE = ("compare.null_seeds", "compare.aa_seeds")


_HASH = re.compile(r"[0-9a-f]{64}")
#: Sections a stage adds before its arm runs: the lr its rule derived and what it read.
DERIVED = ("lr_matched", "norm_matched")
#: The derived sections whose `config_hash` is the SHA-256 of the rest of the section.
HASHED_DERIVED = ("norm_matched",)


def hashed_section(body: dict[str, Any]) -> dict[str, Any]:
    """`body` with `config_hash`, the SHA-256 of its canonical JSON (`spec.fields_hash`)."""
    body = {k: v for k, v in body.items() if k != "config_hash"}
    return {**body, "config_hash": fields_hash(body)}


def _bad(path: str, field: str, what: str) -> common.StudyError:
    return common.StudyError(
        f"{path}: pre-registration field {field!r} {what}; the file is not a valid "
        "pre-registration: restore it from git (git checkout -- <file>) or, if no RL run has "
        "used it, delete it and run --stage=preregister again")


def _field(path: str, record: Any, dotted: str, kind: type, what: str) -> Any:
    """`record[dotted]` (dotted path), refused unless present and of `kind`."""
    value, parts = record, dotted.split(".")
    for i, key in enumerate(parts):
        if not isinstance(value, dict):
            raise _bad(path, ".".join(parts[:i]), f"is {value!r}, not a JSON object")
        if key not in value:
            raise _bad(path, ".".join(parts[:i + 1]), "is missing")
        value = value[key]
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
        raise _bad(path, dotted, f"is {value!r}, not {what}")
    return value


def _hash_field(path: str, record: Any, dotted: str) -> None:
    if not _HASH.fullmatch(_field(path, record, dotted, str, "a SHA-256 hex digest")):
        raise _bad(path, dotted, "is not a SHA-256 hex digest (64 characters 0-9a-f)")


def validate_record(record: Any, path: str) -> dict[str, Any]:
    """`record` (a pre-registration read from `path`) checked as data: every field the study
    reads is present and of its type (`comparison.primary`, `.config_hash`, `.fields`, each
    `frontier` / `lr_matched` / `norm_matched` section, the last with its own hash, each
    amendment's date, reason, changes and hash); returns it, or raises one StudyError naming
    the file and the first bad field."""
    if not isinstance(record, dict):
        raise _bad(path, "<top level>", f"is a {type(record).__name__}, not a JSON object")
    _field(path, record, "comparison.primary", dict, "a JSON object")
    for key, kind, what in (("method", str, "a method name"), ("baseline", str, "a method name"),
                            ("split", str, "a split name"), ("k", int, "an integer"),
                            ("window", int, "an integer")):
        _field(path, record, f"comparison.primary.{key}", kind, what)
    _hash_field(path, record, "comparison.config_hash")
    _field(path, record, "comparison.fields.arms", dict, "a JSON object")
    _field(path, record, "comparison.fields.compare", dict, "a JSON object")
    if "frontier" in record:
        _hash_field(path, record, "frontier.config_hash")
    for name in DERIVED:
        if name in record:
            _field(path, record, name, dict, "a JSON object")
    for name in HASHED_DERIVED:
        if name in record:
            _hash_field(path, record, f"{name}.config_hash")
            if hashed_section(record[name])["config_hash"] != record[name]["config_hash"]:
                raise _bad(path, f"{name}.config_hash", "does not match the section's other "
                           "fields (edited after --stage wrote it?)")
    amendments = record.get("amendments", [])
    if not isinstance(amendments, list):
        raise _bad(path, "amendments", f"is {amendments!r}, not a list")
    for i, a in enumerate(amendments):
        where = f"amendments[{i}]"
        if not isinstance(a, dict):
            raise _bad(path, where, "is not a JSON object")
        for key in ("written", "reason"):
            value = a.get(key)
            if not isinstance(value, str) or not value.strip():
                raise _bad(path, f"{where}.{key}",
                           "is missing" if key not in a else f"is {value!r}, not a text")
        changed = a.get("changed")
        if not isinstance(changed, dict) or not changed or not all(
                isinstance(v, list) and len(v) == 2 and all(isinstance(x, list) for x in v)
                for v in changed.values()):
            raise _bad(path, f"{where}.changed", "is missing" if "changed" not in a else
                       f"is {changed!r}, not {{field: [old seeds, new seeds]}}")
        if not _HASH.fullmatch(str(a.get("config_hash", ""))):
            raise _bad(path, f"{where}.config_hash", "is missing" if "config_hash" not in a
                       else "is not a SHA-256 hex digest (64 characters 0-9a-f)")
    return record


def read_preregistration(path: str) -> dict[str, Any]:
    """The pre-registration at `path`, read and validated (`validate_record`): unreadable
    JSON or a missing / malformed field is one StudyError naming the file and the field."""
    try:
        record = read_json(path)
    except (OSError, ValueError) as e:
        raise common.StudyError(
            f"{path}: cannot read the pre-registration ({type(e).__name__}: {e}); restore it "
            "from git (git checkout -- <file>)") from None
    return validate_record(record, path)


def today() -> str:
    """The ISO date a record is written on (one function: tests move the clock here)."""
    return datetime.date.today().isoformat()


def registered(record: dict[str, Any]) -> dict[str, Any]:
    """What a pre-registration registers: its hashed sections (`comparison`, `frontier`),
    with the amendments' and the derived lrs' (`DERIVED`) -- not the dates it was written
    on, its note or where it lives. Two records register the same study iff these are equal."""
    out = {k: record[k] for k in ("comparison", "frontier", *DERIVED) if k in record}
    out["amendments"] = [{k: v for k, v in a.items() if k != "written"}
                         for a in record.get("amendments", [])]
    return out


def preregistration_path(cfg: ml_collections.ConfigDict) -> str:
    """`compare.preregistration`, or
    `<repo>/results/<kind>/<config.name>/preregistration.json` (`spec.results_dir`)."""
    path = cfg.compare.get("preregistration", "") or ""
    return os.path.abspath(path) if path else os.path.join(results_dir(cfg), PREREGISTRATION)


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
    saved = read_preregistration(path) if os.path.exists(path) else {}
    for name, spec in list(sections.items()):
        if name == "comparison" and name in saved and spec["config_hash"] in \
                comparison_hashes(saved)[1:]:
            sections[name] = saved[name]  # an amended config: the original section stays
        elif name in saved and loop.canonical(saved[name]) != loop.canonical(spec):
            raise common.StudyError(
                f"{path} pre-registers another {name} than this config "
                f"({_differences(saved[name], spec)}); a pre-registration is never rewritten: "
                "keep the config; to add control-arm seeds only, say why in "
                "compare.amendment and run --stage=amend; or, if no RL run has used it, delete "
                "the file deliberately (git rm) and run --stage=preregister again, then commit it")
    record = {"config": str(cfg.get("name", "")), **saved, **sections}
    record.setdefault("written", today())
    record.setdefault("note", "commit this file before any RL run; the study refuses to run "
                              "or aggregate a comparison whose endpoint or config differs")
    if record != saved:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        write_json(path, record)
    return {**record, "path": path}


def _seeds(fields: dict[str, Any], path: str) -> list[int]:
    """The seed list at `path` of comparison fields; () (= compare.seeds) resolved."""
    value = fields["compare"].get(path.split(".")[-1]) or fields["compare"]["seeds"]
    return [int(x) for x in value]


def amendment_changes(saved: dict[str, Any], spec: dict[str, Any]) -> dict[str, Any]:
    """{path: [old seeds, new seeds]} of an admissible amendment from the comparison section
    `saved` to `spec`; StudyError when the primary or any field outside `AMENDABLE` changed,
    or a control's seeds would not be a strict superset (nothing to amend is refused too)."""
    if loop.canonical(saved["primary"]) != loop.canonical(spec["primary"]):
        raise common.StudyError(
            f"an amendment cannot change the primary endpoint ({saved['primary']} -> "
            f"{spec['primary']}); pre-register a new config under its own name instead")
    changed = loop.changed_fields(saved["fields"], spec["fields"])
    other = [c for c in changed if not any(c == a or c.startswith(a + ".") for a in AMENDABLE)]
    if other:
        raise common.StudyError(
            f"an amendment may only add control-arm seeds ({', '.join(AMENDABLE)}); this "
            f"config also changes {', '.join(other[:8])}: restore those fields, or pre-register "
            "a new config under its own name")
    out = {}
    for path in AMENDABLE:
        old, new = _seeds(saved["fields"], path), _seeds(spec["fields"], path)
        if old != new:
            if not set(old) < set(new):
                raise common.StudyError(
                    f"{path}: {old} -> {new}; an amendment may only add seeds (runs already "
                    "made stay in the comparison)")
            out[path] = [old, new]
    if not out:
        raise common.StudyError("nothing to amend: the config's comparison equals the "
                                "pre-registration's latest section")
    return out


def comparison_hashes(saved: dict[str, Any]) -> list[str]:
    """The config hashes a comparison may have: the original section's and each amendment's."""
    return [saved["comparison"]["config_hash"]] + [
        a["config_hash"] for a in saved.get("amendments", [])]


def write_amendment(cfg: ml_collections.ConfigDict) -> dict[str, Any]:
    """Append an amendment (module docstring) to the committed pre-registration: the config
    adds control-arm seeds and says why in `compare.amendment`; the latest registered
    comparison (the original with every earlier amendment applied) is what it amends."""
    path = preregistration_path(cfg)
    if not os.path.exists(path):
        raise common.StudyError(f"no pre-registration at {path} to amend: run "
                                "--stage=preregister first")
    reason = str(cfg.compare.get("amendment", "") or "").strip()
    if not reason:
        raise common.StudyError("--stage=amend needs the reason in config.compare.amendment "
                                "(one sentence, recorded in the pre-registration)")
    saved = read_preregistration(path)
    spec = comparison_spec(cfg)
    if spec["config_hash"] in comparison_hashes(saved):
        return {**saved, "path": path}  # already recorded: re-running the stage is a no-op
    for i, earlier in enumerate(saved.get("amendments", [])):
        if " ".join(earlier["reason"].split()).lower() == " ".join(reason.split()).lower():
            raise common.StudyError(
                f"compare.amendment repeats the reason of amendment {i + 1} in {path} "
                f"({earlier['written']}: {earlier['reason'][:120]!r}); every amendment needs "
                "its own reason: say in --config.compare.amendment why these seeds are added")
    latest = dict(saved["comparison"])
    for a in saved.get("amendments", []):  # apply the earlier amendments' seed lists
        fields = loop.canonical(latest["fields"])
        for p, (_, new) in a["changed"].items():
            fields["compare"][p.split(".")[-1]] = new
        latest = {**latest, "fields": fields}
    changes = amendment_changes(latest, spec)
    record = {**saved, "amendments": saved.get("amendments", []) + [{
        "written": today(), "reason": reason, "changed": changes,
        "config_hash": spec["config_hash"]}]}
    write_json(path, record)
    return {**record, "path": path}


def _differences(saved: dict[str, Any], spec: dict[str, Any]) -> str:
    changed = loop.changed_fields(saved, spec)
    shown = [c for c in changed if not c.endswith("config_hash")][:8]
    return "changed: " + (", ".join(shown) if shown else "config_hash")


def git_committed(path: str) -> bool | None:
    """Whether `path` is committed: in git's HEAD commit with no change in the index or the
    working tree. False for an untracked, staged-only or modified file and for a file outside
    any git repository; None when git itself cannot be run."""
    path = os.path.abspath(path)
    where = os.path.dirname(path)
    try:
        # In HEAD (a staged new file is in the index, not in a commit).
        in_head = subprocess.run(["git", "-C", where, "cat-file", "-e",
                                  f"HEAD:./{os.path.basename(path)}"],
                                 capture_output=True, timeout=20)
        if in_head.returncode != 0:
            return False
        # No difference between HEAD and the working tree (staged or not).
        clean = subprocess.run(["git", "-C", where, "diff", "--quiet", "HEAD", "--",
                                os.path.basename(path)], capture_output=True, timeout=20)
        return clean.returncode == 0
    except (OSError, subprocess.SubprocessError):
        return None


def uncommitted_reason(committed: bool | None) -> str:
    """Why a pre-registration does not count as committed (`git_committed`'s answer)."""
    return ("git cannot be run to tell whether the pre-registration is committed"
            if committed is None else
            "the pre-registration is not committed in git (untracked, staged only or modified)")


def require_committed(cfg: ml_collections.ConfigDict, what: str = "--stage=export") -> str:
    """Refuse `what` unless the config's pre-registration exists, matches the config
    (`check_preregistration`) and is committed in git; returns its path."""
    path = preregistration_path(cfg)
    committed = check_preregistration(cfg)["committed"]
    if not committed:
        raise common.StudyError(
            f"{what}: {uncommitted_reason(committed)}: {path}. An export is a pre-registered "
            "result: commit the file (git add <file> && git commit) before the export -- or "
            "it stays an exploration, which is not exported")
    return path


def check_preregistration(cfg: ml_collections.ConfigDict, section: str = "comparison"
                          ) -> dict[str, Any]:
    """Refuse (StudyError naming the file and the fix) unless the pre-registration exists and
    its `section` equals the config's; returns {path, found, committed, hash_matches}."""
    path = preregistration_path(cfg)
    fix = (f"write it with `python -m {get_kind(cfg).binary} --config=<{cfg.get('name', '')} "
           "config>"
           " --stage=preregister` and commit it before any RL run")
    if not os.path.exists(path):
        raise common.StudyError(f"no pre-registration at {path}: {fix}")
    saved = read_preregistration(path)
    spec = comparison_spec(cfg) if section == "comparison" else frontier_spec(cfg)
    if section not in saved:
        raise common.StudyError(f"{path} has no {section!r} section: {fix}")
    amended = (section == "comparison" and spec["config_hash"] in comparison_hashes(saved)
               and loop.canonical(saved[section]["primary"]) == loop.canonical(spec["primary"]))
    if not amended and loop.canonical(saved[section]) != loop.canonical(spec):
        raise common.StudyError(
            f"the config's {section} differs from its pre-registration {path} "
            f"({_differences(saved[section], spec)}): run the pre-registered config, or "
            "pre-register a new config under its own name (a new config.name); adding "
            "control-arm seeds only: say why in compare.amendment and run --stage=amend")
    committed = git_committed(path)
    if not committed:
        logging.warning("%s: %s; this comparison is reported as not committed, and "
                        "--stage=export refuses it until the file is committed",
                        path, uncommitted_reason(committed))
    return {"path": repo_path(path), "found": True, "committed": committed,
            "hash_matches": True, "primary_matches": True}


def check_primary(cfg: ml_collections.ConfigDict) -> dict[str, Any]:
    """The aggregator's check: a primary endpoint that differs from the pre-registration's is
    refused; a missing file or a changed config hash is recorded, not refused."""
    path = preregistration_path(cfg)
    if not os.path.exists(path):
        return {"path": repo_path(path), "found": False}
    record = read_preregistration(path)
    saved = record["comparison"]
    spec = comparison_spec(cfg)
    if loop.canonical(saved["primary"]) != loop.canonical(spec["primary"]):
        raise common.StudyError(
            f"compare.primary / baseline / gate {spec['primary']} differ from the "
            f"pre-registered primary endpoint in {path}: {saved['primary']}; the primary "
            "cannot change after the pre-registration (read the other endpoint among the "
            "secondary ones)")
    hashes = comparison_hashes(record)
    amendments = [{k: a[k] for k in ("written", "reason", "changed")}
                  for a in record.get("amendments", [])]
    return {"path": repo_path(path), "found": True, "committed": git_committed(path),
            "primary_matches": True, "hash_matches": spec["config_hash"] in hashes,
            "config_hash": spec["config_hash"] if spec["config_hash"] in hashes
            else saved["config_hash"], "amendments": amendments}


__all__ = ["AMENDABLE", "DERIVED", "HASHED_DERIVED", "PREREGISTRATION", "amendment_changes",
           "check_preregistration", "check_primary", "comparison_hashes", "git_committed",
           "hashed_section", "preregistration_path",
           "read_preregistration", "registered", "require_committed", "today",
           "uncommitted_reason", "validate_record", "write_amendment", "write_preregistration"]
