"""The maze configs' schema (tuples, one sibling level, a docstring true to the code) and the
study's list arguments: method names or `Method` presets, seeds from `--seeds`, and old
comma strings refused with the tuple to write instead."""

import dataclasses
import os
import re

import ml_collections
import pytest

from sera_jax import config_files
from sera_jax import methods as methods_lib
from sera_jax.studies import common
from sera_jax.studies import paired as study
from sera_jax.studies.paired import config, spec
from tests import util

CONFIGS = os.path.join(util.ROOT, "configs", "maze")
NAMES = sorted(f[:-3] for f in os.listdir(CONFIGS) if f.endswith(".py"))


def load_config(name):
    return config_files.get_config(os.path.join(CONFIGS, f"{name}.py"))


def _with(name: str, field: str, value):
    """Config `name` with `field` set to `value` of any type (as a user's own config file
    could write it; a ConfigDict refuses to change a field's type)."""
    d = load_config(name).to_dict()
    *head, last = field.split(".")
    node = d
    for key in head:
        node = node[key]
    node[last] = value
    return ml_collections.ConfigDict(d)


def _siblings(name: str) -> list[str]:
    source = open(os.path.join(CONFIGS, f"{name}.py")).read()
    return re.findall(r"sibling\(__file__, \"([\w.]+)\.py\"\)", source)


def test_configs_extend_at_most_one_sibling_one_level_deep():
    assert {"cpu", "cpu_16step", "tiny", "maze17_paper", "regime_map", "theta_sweep"} <= set(
        NAMES)
    for name in NAMES:
        for parent in _siblings(name):
            assert _siblings(parent) == [], f"{name} -> {parent} -> {_siblings(parent)}"
    # The sweeps and the paper config extend the 16-step default whose results they document.
    for name in ("theta_sweep", "regime_map", "maze17_paper"):
        assert _siblings(name) == ["cpu_16step"], name
    assert _siblings("tiny") == ["cpu"]  # the tiny pipeline is the long-horizon default's


@pytest.mark.parametrize("name", ["cpu", "cpu_16step", "tiny", "maze17_paper", "regime_map",
                                  "theta_sweep"])
def test_list_fields_are_tuples(name):
    c = load_config(name)
    for value in (c.compare.methods, c.compare.seeds, c.compare.null_seeds,
                  c.compare.get("aa_seeds", ())):
        assert isinstance(value, tuple)
    if "regime" in c:
        for field in ("prompts_per_step", "rollouts_per_prompt", "methods", "seeds",
                      "thresholds"):
            assert isinstance(c.regime[field], tuple), field
        assert study.regime_methods(c) == list(c.regime.methods)


def _doc(name: str) -> str:
    return " ".join(config_files.load_module(os.path.join(CONFIGS, f"{name}.py")).__doc__.split())


def test_cpu_16step_docstring_states_what_the_code_runs():
    c = load_config("cpu_16step")
    doc = _doc("cpu_16step")
    budget = c.rl.prompts_per_step * c.rl.rollouts_per_prompt
    for claim in (f"{len(c.compare.seeds)} seeds", f"{c.rl.num_steps} RL steps",
                  f"{c.rl.prompts_per_step} prompts x N0 {c.rl.rollouts_per_prompt} = "
                  f"{budget} rollouts", f"{c.eval.num_samples} samples each",
                  f"SFT ({c.sft.num_steps} x {c.sft.batch_size})",
                  f"{c.task.size}x{c.task.size}", f"every {c.eval.every} steps",
                  f"{c.eval.num_prompts} held-out and the {c.eval.train_prompts} training"):
        assert claim in doc, claim


def test_cpu_docstring_states_what_the_code_runs():
    c = load_config("cpu")
    doc = _doc("cpu")
    budget = c.rl.prompts_per_step * c.rl.rollouts_per_prompt
    p = c.compare.primary
    for claim in (f"{c.rl.num_steps} RL steps", f"({len(c.compare.seeds)} paired seeds each)",
                  f"null control ({len(c.compare.null_seeds)} seeds)",
                  f"A/A control ({len(c.compare.aa_seeds)} seeds)",
                  f"{c.task.num_train} training mazes ({c.task.size}x{c.task.size}), "
                  f"{c.task.num_eval} held-out",
                  f"P {c.rl.prompts_per_step} x N0 {c.rl.rollouts_per_prompt} = {budget}",
                  f"SFT {c.sft.num_steps} x {c.sft.batch_size}",
                  f"n_max {c.rl.allocation.n_max} = 8·N0",
                  "lr " + f"{c.rl.optimizer.learning_rate:.0e}".replace("e-0", "e-")
                  + ", from the pilot",
                  f"held-out pass@{p.k}, averaged over the last {p.window}",
                  f"micro-batches of {c.rl.micro_batch_size} rows",
                  f"{c.eval.train_prompts and 'Gate: uniform − null at held-out pass@1'}"):
        assert claim in doc, claim
    assert p.split == "eval" and p.method == "sera" and c.compare.baseline == "uniform"
    assert c.eval.every == 100 and c.rl.train_length_bucket == 8


@pytest.mark.parametrize("field, value, match", [
    ("compare.methods", "uniform,sera",
     r"compare.methods='uniform,sera' is a string; write a tuple, e.g. \('uniform', 'sera'\)"),
    # What `--config.compare.methods=uniform,sera` gives on a tuple field:
    ("compare.methods", ("uniform,sera",), "one method name per item"),
    ("compare.methods", ("uniform", "serra"), r"did you mean 'sera'"),
    ("compare.methods", ("uniform", "uniform"), "names a method twice"),
    ("compare.seeds", "0,1", r"compare.seeds='0,1' is a string; write a tuple"),
    ("compare.seeds", (0, -1), r"a tuple of integers >= 0"),
    ("compare.null_seeds", "", "is a string; write a tuple"),
])
def test_old_comma_strings_and_bad_lists_fail_naming_the_field(field, value, match):
    with pytest.raises(common.StudyError, match=match):
        study.validate_compare(_with("tiny", field, value))


def test_regime_lists_fail_naming_the_field():
    for field, value, match in (("regime.thresholds", "0.05,0.2", "is a string"),
                                ("regime.prompts_per_step", (), "is empty"),
                                ("regime.seeds", ("0",), "a tuple of integers"),
                                ("regime.methods", "uniform,sera", "is a string")):
        with pytest.raises(common.StudyError, match=re.escape(f"{field}")) as err:
            study.validate_regime(_with("regime_map", field, value))
        assert match in str(err.value), (field, str(err.value))
    assert study.regime_thresholds(load_config("regime_map")) == [None]  # () = no θ axis


def test_run_takes_method_names_or_method_presets(tmp_path):
    """`run` takes `Method` presets as well as names (validated before any work: here the
    run stops at a bad eval field, after the methods were accepted)."""
    bad = util.set_field(load_config("tiny"), "eval.num_prompts", 99)
    sera = methods_lib.get_method("sera")
    with pytest.raises(common.StudyError, match="eval.num_prompts"):
        study.run(bad, str(tmp_path / "x"), "all", [sera, "uniform"], ["0"])
    changed = dataclasses.replace(sera, options={**sera.options, "threshold": 0.5})
    with pytest.raises(common.StudyError, match="not the preset"):
        study.run(bad, str(tmp_path / "x"), "all", [changed], [0])
    with pytest.raises(common.StudyError, match="--seeds='0,x': expected a comma-separated"):
        study.run(bad, str(tmp_path / "x"), "all", ["sera"], ["0", "x"])
    assert not os.path.exists(tmp_path / "x")


def test_binaries_follow_the_one_pattern():
    for name in ("maze", "maze_smoke", "math_rl"):
        source = open(os.path.join(util.ROOT, "experiments", f"{name}.py")).read()
        assert len(source.splitlines()) <= 30 and "common.binary(" in source, name
        assert "from sera_jax.studies.paired import" in source and "importlib" not in source


def test_validate_resolves_every_arm_once_into_the_method_its_runs_train_with(monkeypatch):
    """`validate` is the one place a name becomes a `Method`: it returns every arm's, and
    the stages pass it down (`stage_rl(..., resolved=...)` -> `Trainer(method=...)`)."""
    cfg = config_files.get_config(os.path.join(util.ROOT, "configs", "maze", "tiny.py"))
    calls = []
    real = methods_lib.resolve
    monkeypatch.setattr(methods_lib, "resolve", lambda *a, **k: calls.append(a[0]) or real(*a, **k))
    methods, seeds = list(cfg.compare.methods), list(cfg.compare.seeds)
    resolved = study.validate(cfg, methods, seeds)
    assert set(resolved) == {arm for arm, _ in study.arms(cfg, methods, seeds)}
    assert all(isinstance(m, methods_lib.Method) for m in resolved.values())
    assert resolved["sera"] == methods_lib.get_method("sera")
    assert len(calls) == len(resolved)  # once per arm, not per run or per seed


def test_task_generator_in_the_fingerprint_only_when_not_prim():
    base = load_config("cpu")
    assert "generator" not in base.task
    named = _with("cpu", "task.generator", "prim")
    back = _with("cpu", "task.generator", "backtracker")
    assert spec.start_fingerprint(named) == spec.start_fingerprint(base)
    assert spec.start_fingerprint(back)["task"]["generator"] == "backtracker"
    assert load_config("cpu_read").task.generator == "backtracker"
    with pytest.raises(common.StudyError, match="task.generator"):
        config.validate(_with("cpu", "task.generator", "dfs"), ("uniform",), (0,))


def test_frontiers_config_starts_from_cpu_reads_start_with_its_rl_shape():
    """configs/maze/frontiers.py restates cpu_read's task, SFT and RL shape (one sibling
    level): the same start (fingerprint), the same runs but for the sealed split and lr grid."""
    read, front = load_config("cpu_read"), load_config("frontiers")
    assert spec.start_fingerprint(front) == spec.start_fingerprint(read)
    for block in ("sft", "model"):
        assert front[block].to_dict() == read[block].to_dict(), block
    sealed = {"num_test", "test_seed"}
    assert {k: v for k, v in front.task.to_dict().items() if k not in sealed} == \
        read.task.to_dict()
    rl_f, rl_r = front.rl.to_dict(), read.rl.to_dict()
    assert rl_f == rl_r
    for field in ("every", "paired_noise", "num_samples", "curve_samples", "num_prompts",
                  "train_prompts", "seed", "noise_seed", "temperature"):
        assert front.eval[field] == read.eval[field], field
    assert front.compare.primary.split == "test" and front.task.num_test > 0
    assert front.task.test_seed != read.task.seed
