"""Results as data under bad input (issue 51): the export is atomic and owned, the recompute
scripts fail in one line, pre-registrations are validated as data and must be committed
before an export, amendments need their own reasons, and every paired config has the same
`compare` fields. Fast: no study runs (the export's readers of a workdir are stubbed, the
recompute reads the committed quick math export)."""

import hashlib
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from sera_jax import config_files
from sera_jax.studies import common
from sera_jax.studies import paired as study
from sera_jax.studies.paired import export, frontier, matched, prereg, recompute, spec, tables
from tests import util

QUICK = os.path.join(util.ROOT, "results", "math", "math_smollm2_arith_quick")


def _tiny(path, name="maze_tiny"):
    cfg = config_files.get_config(os.path.join(util.ROOT, "configs", "maze", "tiny.py"))
    cfg.name = name
    cfg.compare.preregistration = str(path)
    cfg.compare.exploratory = False
    return cfg


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    """A finished comparison's workdir as the export reads it (its per-run records stubbed:
    `gather` / `data_arrays` are the aggregator's, tested with the study)."""
    work = tmp_path / "work"
    os.makedirs(work / "results")
    os.makedirs(work / "sft")
    table = {"methods": {}, "validity": {"path": str(work / "sft" / "validity.json")},
             "preregistration": {"path": str(tmp_path / "p.json"), "found": True}}
    json.dump(table, open(work / "results" / "comparison.json", "w"))
    json.dump({"blind_q": [0.1, 0.2]}, open(work / "sft" / "validity.json", "w"))
    monkeypatch.setattr(export, "gather", lambda *a, **k: {})
    monkeypatch.setattr(export, "data_arrays",
                        lambda *a, **k: {"run/uniform/0/final/eval": np.arange(3, dtype=np.int16)})
    prereg.write_preregistration(_tiny(tmp_path / "p.json"))
    return str(work)


def _digests(folder):
    return {f: hashlib.sha256(open(os.path.join(folder, f), "rb").read()).hexdigest()
            for f in sorted(os.listdir(folder))}


# ----------------------------------------------------------------------------- export


def test_reexport_replaces_the_whole_folder_and_lists_hashes(workdir, tmp_path):
    cfg, out = _tiny(tmp_path / "p.json"), str(tmp_path / "results" / "maze_tiny")
    first = export.export_results(cfg, workdir, out_dir=out)
    manifest = json.load(open(os.path.join(out, "export.json")))
    assert manifest["config"] == "maze_tiny" and len(manifest["config_hash"]) == 64
    assert set(manifest["files"]) == set(first["files"]) - {"export.json"}
    for name, entry in manifest["files"].items():
        assert entry["sha256"] == export.sha256_file(os.path.join(out, name)), name
    # Paths inside the exported files: the workdir's file relative to it, the
    # pre-registration as its exported copy; nothing names the machine's folders.
    saved = json.load(open(os.path.join(out, "comparison.json")))
    assert saved["validity"]["path"] == "sft/validity.json"
    assert saved["preregistration"]["path"] == os.path.join(out, "preregistration.json")
    for name in os.listdir(out):
        assert workdir not in open(os.path.join(out, name), "rb").read().decode("latin-1")
    # Another export's file left in the folder, and a hand-written stamp.
    json.dump({"lrs": {}}, open(os.path.join(out, "frontier.json"), "w"))
    json.dump({"note": "by hand"}, open(os.path.join(out, "stamp.json"), "w"))
    again = export.export_results(cfg, workdir, out_dir=out)
    assert not os.path.exists(os.path.join(out, "frontier.json"))  # never part of a folder
    assert json.load(open(os.path.join(out, "stamp.json"))) == {"note": "by hand"}
    assert again["kept"] == ["stamp.json"]
    assert not [f for f in os.listdir(tmp_path / "results") if f != "maze_tiny"]  # no temp
    assert recompute.check_files(out, json.load(open(os.path.join(out, "export.json")))) == []


def test_a_folder_holding_another_study_is_refused_naming_both(workdir, tmp_path):
    out = str(tmp_path / "results" / "shared")
    export.export_results(_tiny(tmp_path / "p.json"), workdir, out_dir=out)
    before = _digests(out)
    other = _tiny(tmp_path / "q.json", name="maze_other")
    prereg.write_preregistration(other)
    with pytest.raises(common.StudyError, match=r"another study \(config 'maze_tiny'.*"
                                                r"not of this one \(config 'maze_other'"):
        export.export_results(other, workdir, out_dir=out)
    # The same name with another comparison (the issue's --config.name=<other study>).
    changed = util.set_field(_tiny(tmp_path / "r.json"), "rl.optimizer.learning_rate", 0.5)
    with pytest.raises(common.StudyError, match="holds the export of another study"):
        export.export_results(changed, workdir, out_dir=out)
    assert _digests(out) == before  # nothing was touched


def test_an_export_that_cannot_be_written_is_one_error_and_keeps_the_old_one(
        workdir, tmp_path, monkeypatch):
    cfg, out = _tiny(tmp_path / "p.json"), str(tmp_path / "results" / "maze_tiny")
    export.export_results(cfg, workdir, out_dir=out)
    before = _digests(out)

    def full_disk(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(export.np, "savez_compressed", full_disk)
    with pytest.raises(common.StudyError, match="cannot write the export into .*No space left"
                                                ".*nothing was replaced"):
        export.export_results(cfg, workdir, out_dir=out)
    assert _digests(out) == before
    assert os.listdir(tmp_path / "results") == ["maze_tiny"]  # the temporary folder is gone
    monkeypatch.undo()
    if os.geteuid() != 0:  # root writes into read-only folders
        os.chmod(tmp_path / "results", 0o555)
        try:
            with pytest.raises(common.StudyError, match="not writable"):
                export.export_results(cfg, workdir, out_dir=out)
        finally:
            os.chmod(tmp_path / "results", 0o755)


def test_export_stage_refuses_an_uncommitted_preregistration(tmp_path):
    cfg = _tiny(tmp_path / "p.json")
    study.run(cfg, str(tmp_path / "w"), "preregister")
    with pytest.raises(common.StudyError, match=r"--stage=export: the pre-registration is "
                                                r"not committed in git .*p\.json"):
        study.run(cfg, str(tmp_path / "w"), "export")
    assert not os.path.exists(tmp_path / "w")  # refused before any work
    explore = _tiny(tmp_path / "p.json")
    explore.compare.exploratory = True
    with pytest.raises(common.StudyError, match="exploratory results are not exported"):
        study.run(explore, str(tmp_path / "w"), "export")


def test_git_committed_holds_only_for_a_committed_unchanged_file(tmp_path):
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t",
           "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}

    def git(*args):
        subprocess.run(["git", "-C", str(tmp_path), *args], check=True, capture_output=True,
                       env=env)

    git("init", "-q")
    (tmp_path / "other.txt").write_text("x")
    git("add", "other.txt")
    git("commit", "-qm", "first")
    path = tmp_path / "results" / "p.json"
    os.makedirs(path.parent)
    path.write_text("{}")
    assert prereg.git_committed(str(path)) is False  # untracked
    git("add", "results/p.json")
    assert prereg.git_committed(str(path)) is False  # staged, never committed
    git("commit", "-qm", "prereg")
    assert prereg.git_committed(str(path)) is True
    path.write_text('{"x": 1}')
    assert prereg.git_committed(str(path)) is False  # modified
    git("add", "results/p.json")
    assert prereg.git_committed(str(path)) is False  # modified and staged
    outside = tmp_path.parent / "outside_any_repo.json"
    outside.write_text("{}")
    assert prereg.git_committed(str(outside)) is False


# ----------------------------------------------------------------------------- recompute


@pytest.fixture
def quick(tmp_path):
    """A copy of the committed quick math export (written before manifests had hashes)."""
    folder = str(tmp_path / "quick")
    shutil.copytree(QUICK, folder)
    return folder


def _hashed(folder):
    """The export as --stage=export writes it now: its manifest lists every file's hash."""
    path = os.path.join(folder, "export.json")
    manifest = json.load(open(path))
    manifest["files"] = {f: {"bytes": os.path.getsize(os.path.join(folder, f)),
                             "sha256": export.sha256_file(os.path.join(folder, f))}
                         for f in export.EXPORT_FILES if os.path.exists(os.path.join(folder, f))}
    json.dump(manifest, open(path, "w"))
    return folder


def _error(folder, capsys):
    """`recompute.main(folder)`: exit status 1 and one line on stderr (returned)."""
    assert recompute.main(folder) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err and "Traceback" not in err, err
    return err


def test_an_old_export_without_hashes_recomputes_with_a_note(quick, capsys):
    assert recompute.main(quick) == 0
    out = capsys.readouterr().out
    assert "lists no file hashes" in out
    assert out.rstrip().endswith("saved values recomputed equal")


def test_damaged_folders_and_files_are_one_line_naming_them(quick, tmp_path, capsys):
    assert "no such folder" in _error(str(tmp_path / "missing"), capsys)
    os.makedirs(tmp_path / "empty")
    assert "not an export folder" in _error(str(tmp_path / "empty"), capsys)
    # Foreign: a folder of another study's files (the allocation lab's results).
    lab = os.path.join(util.ROOT, "results", "lab", "cpu_default")
    assert "export.json: missing" in _error(lab, capsys)
    counts = os.path.join(quick, "counts.npz")
    good = open(counts, "rb").read()
    cases = {
        "truncated": good[:len(good) // 2],
        "empty": b"",
        "garbage": bytes(np.random.default_rng(0).integers(0, 256, 4096, dtype=np.uint8)),
    }
    for what, data in cases.items():
        open(counts, "wb").write(data)
        err = _error(quick, capsys)
        assert "counts.npz" in err and "allow_pickle" not in err, (what, err)
    # An archive holding a Python object is never unpickled.
    np.savez(counts, x=np.array([{"a": 1}], dtype=object))
    assert "holds Python objects" in _error(quick, capsys)
    open(counts, "wb").write(good)
    for name, data in (("comparison.json", b'{"methods": {"uni'), ("config.json", b""),
                       ("export.json", b"[1, 2]")):
        path = os.path.join(quick, name)
        saved = open(path, "rb").read()
        open(path, "wb").write(data)
        assert name in _error(quick, capsys)
        open(path, "wb").write(saved)
    os.remove(os.path.join(quick, "config.json"))
    assert "config.json: missing" in _error(quick, capsys)


def test_a_folder_mixing_two_studies_is_named_by_its_manifest(quick, tmp_path, capsys):
    _hashed(quick)
    assert recompute.main(quick) == 0
    capsys.readouterr()
    # Another study's frontier.json beside the export (the mixed folder).
    shutil.copy(os.path.join(util.ROOT, "results", "maze", "maze_cpu_read", "frontier.json"),
                quick)
    assert "frontier.json is not in export.json's file list" in _error(quick, capsys)
    os.remove(os.path.join(quick, "frontier.json"))
    # A file of another export in its place: its hash differs from the manifest's.
    shutil.copy(os.path.join(util.ROOT, "results", "math", "math_smollm2_arith", "counts.npz"),
                quick)
    assert "counts.npz: its SHA-256 differs" in _error(quick, capsys)
    # Without hashes (an old export), files that do not fit are still one line.
    unhashed = str(tmp_path / "old")
    shutil.copytree(QUICK, unhashed)
    shutil.copy(os.path.join(util.ROOT, "results", "maze", "maze_cpu_read", "config.json"),
                unhashed)
    assert "error: " in _error(unhashed, capsys)


def test_the_recompute_scripts_fail_in_one_line(tmp_path):
    for kind in ("maze", "math"):
        res = subprocess.run([sys.executable, os.path.join(util.ROOT, "results", kind,
                                                           "recompute.py"),
                              str(tmp_path / "nope")], capture_output=True, text=True,
                             timeout=300)
        assert res.returncode == 1 and "Traceback" not in res.stderr, res.stderr
        assert res.stderr.strip().splitlines()[-1].startswith("error: ") and \
            "no such folder" in res.stderr


# ----------------------------------------------------------------------------- pre-registration


@pytest.mark.parametrize("damage, field", [
    (lambda r: r["comparison"].pop("config_hash"), "comparison.config_hash"),
    (lambda r: r["comparison"]["primary"].update(k="64"), "comparison.primary.k"),
    (lambda r: r["comparison"].pop("fields"), "comparison.fields"),
    (lambda r: r["comparison"].update(config_hash="abc"), "comparison.config_hash"),
    (lambda r: r.pop("comparison"), "comparison"),
    (lambda r: r.update(amendments={}), "amendments"),
    (lambda r: r.update(amendments=[{"written": "2026-01-01", "changed": {}}]),
     "amendments[0].reason"),
])
def test_a_malformed_preregistration_is_one_error_naming_the_field(tmp_path, damage, field):
    path = tmp_path / "p.json"
    cfg = _tiny(path)
    prereg.write_preregistration(cfg)
    record = json.load(open(path))
    damage(record)
    json.dump(record, open(path, "w"))
    for check in (prereg.check_preregistration, prereg.check_primary,
                  prereg.write_preregistration):
        with pytest.raises(common.StudyError) as e:
            check(cfg)
        assert f"field {field!r}" in str(e.value) and str(path) in str(e.value), str(e.value)
    path.write_text('{"comparison": ')
    with pytest.raises(common.StudyError, match="cannot read the pre-registration"):
        prereg.check_preregistration(cfg)


def test_every_amendment_needs_its_own_reason(tmp_path):
    path = tmp_path / "p.json"
    cfg = _tiny(path)
    cfg.compare.null_seeds = (0,)
    prereg.write_preregistration(cfg)
    first = util.set_field(_tiny(path), "compare.null_seeds", (0, 1))
    first.compare.amendment = "one null seed left the gate's band wide"
    prereg.write_amendment(first)
    again = util.set_field(_tiny(path), "compare.null_seeds", (0, 1, 2))
    again.compare.amendment = "  One null seed left the gate's band WIDE "  # the same reason
    saved = open(path).read()
    with pytest.raises(common.StudyError, match="repeats the reason of amendment 1"):
        study.run(again, str(tmp_path / "w"), "amend")
    assert open(path).read() == saved
    again.compare.amendment = "two null seeds still left it wide"
    assert len(prereg.write_amendment(again)["amendments"]) == 2


def test_every_table_says_when_the_preregistration_is_not_committed(tmp_path):
    path = tmp_path / "p.json"
    cfg = _tiny(path)
    prereg.write_preregistration(cfg)
    checked = prereg.check_preregistration(cfg)
    assert checked["committed"] is False  # a file git does not hold
    primary = prereg.check_primary(cfg)
    assert "file not committed in git" in tables._prereg_sentence({"preregistration": primary})
    assert any("not committed in git" in line for line in frontier.validity_lines(
        {"preregistration": checked}))
    out = {"choice": {"uniform_gains": {}, "lr": None, "reason": "none", "target_gain": 0.0},
           "rule": "r",
           "method": "sera", "method_lr": 1e-5, "preregistration": checked}
    assert "not committed in git" in matched.matched_markdown(out)
    # An exploration says so instead (its record has no path).
    explore = {"found": False, "exploratory": True}
    assert spec.EXPLORATORY in "".join(frontier.validity_lines({"preregistration": explore}))
    # Inside the repository the record names the file relative to it.
    committed = os.path.join(util.ROOT, "results", "maze", "maze_cpu_read",
                             "preregistration.json")
    assert spec.repo_path(committed) == "results/maze/maze_cpu_read/preregistration.json"


# ----------------------------------------------------------------------------- one schema


def _paired_configs():
    out = {}
    for kind in ("maze", "math"):
        folder = os.path.join(util.ROOT, "configs", kind)
        for name in sorted(os.listdir(folder)):
            if name.endswith(".py"):
                cfg = config_files.get_config(os.path.join(folder, name))
                if "compare" in cfg:
                    out[f"{kind}/{name}"] = cfg
    return out


def test_every_paired_config_has_the_same_compare_fields():
    configs = _paired_configs()
    assert len(configs) >= 15, sorted(configs)
    fields = {name: set(cfg.compare.keys()) for name, cfg in configs.items()}
    union = set().union(*fields.values())
    assert {"preregistration", "amendment", "exploratory", "primary", "aa_seeds",
            "validity_k"} <= union
    missing = {name: sorted(union - f) for name, f in fields.items() if union - f}
    assert not missing, missing
    # The documented amend recipe's overrides exist on every config, maze and math alike.
    for name, cfg in configs.items():
        util.set_field(cfg, "compare.preregistration", "/elsewhere/p.json")
        util.set_field(cfg, "compare.amendment", "a reason")
        assert prereg.preregistration_path(cfg) == "/elsewhere/p.json", name
