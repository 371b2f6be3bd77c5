"""The math kind (`sera_jax.studies.paired.kinds.lm`), a paired study on a pretrained LM:
which configs are LM studies, where their results go, the answer-blind control, validation
before any model loads, and the run plan of disjoint `--methods` processes."""

import json
import os

import numpy as np
import pytest

from sera_jax import config_files
from sera_jax.studies import common
from sera_jax.studies.paired import config, kinds, prereg, spec
from sera_jax.studies.paired.kinds import lm
from sera_jax.tasks.mathqa.data import MathProblem
from tests import util
from tests.studies.paired import golden


def load(name: str):
    return config_files.get_config(os.path.join(util.ROOT, "configs", name))


class _Task:
    """A stand-in with the `MathTask` methods `blind_validity` reads."""

    def __init__(self, train, held):
        self._p = {"train": [MathProblem(q, a) for q, a in train],
                   "eval": [MathProblem(q, a) for q, a in held]}

    def problems(self, split):
        return list(self._p[split])

    def split_size(self, split):
        return len(self._p[split])


def test_lm_configs_are_lm_studies_with_their_own_results_folder():
    arith, maze = load("math/smollm2_arith.py"), load("maze/cpu_read.py")
    assert kinds.get_kind(arith).name == "math" and kinds.get_kind(maze).name == "maze"
    assert arith.kind == "math" and maze.kind == "maze"
    path = prereg.preregistration_path(arith)
    assert path.endswith(os.path.join("results", "math", "math_smollm2_arith",
                                      "preregistration.json"))
    assert os.path.exists(path)  # committed before any RL run
    # The start's fingerprint is task + model: there is no SFT block to read.
    assert set(spec.start_fingerprint(arith)) == {"task", "model"}


def test_committed_preregistrations_match_the_math_configs():
    for name in ("smollm2_arith", "smollm2_arith_quick", "smollm2_steps",
                 "smollm2_steps_quick"):
        cfg = load(f"math/{name}.py")
        prereg.check_preregistration(cfg, "comparison")  # raises on any difference


def test_blind_control_is_exact_for_the_training_answer_frequencies():
    task = _Task(train=[("a", "7"), ("b", "7"), ("c", "1,200"), ("d", "3")],
                 held=[("e", "7"), ("f", "1200"), ("g", "9")])
    r = lm.blind_validity(task, "eval", 3, [1, 4])
    q = np.array([0.5, 0.25, 0.0])  # "1,200" and "1200" are one answer; 9 never drawn
    assert r["blind_q"] == pytest.approx(q)
    assert r["blind_pass_at_k"]["1"] == pytest.approx(q.mean())
    assert r["blind_pass_at_k"]["4"] == pytest.approx(np.mean(1 - (1 - q) ** 4))
    assert r["seen_in_sft"] == pytest.approx(2 / 3) and r["distinct_answers"] == 3
    assert r["distinct_sft_answers"] == 3 and r["num_prompts"] == 3 and r["kind"] == "math"


@pytest.mark.parametrize("field,value,match", [
    ("model.source", "zip", "model.source"),
    ("task.templates", "small_add,nope", "task.templates"),
    ("eval.top_p", 1.5, "eval.top_p"),
    ("model.init_checkpoint", "/tmp/x", "model.init_checkpoint"),
])
def test_bad_lm_fields_fail_before_any_model_loads(field, value, match, tmp_path):
    cfg = util.set_field(load("math/smollm2_arith.py"), field, value)
    with pytest.raises(common.StudyError, match=match):
        config.validate(cfg, ["uniform", "sera"], [0])


def test_disjoint_methods_processes_never_share_a_run():
    cfg = load("math/smollm2_arith_quick.py")
    with_base = spec.rl_plan(cfg, ["uniform"], [0], only_these_methods=True)
    without = spec.rl_plan(cfg, ["sera"], [0], only_these_methods=True)
    assert [a for a, _ in with_base] == ["uniform", spec.NULL]
    assert [a for a, _ in without] == ["sera"]
    # Without --methods every arm and its controls run, as before.
    assert [a for a, _ in spec.rl_plan(cfg, ["uniform", "sera"], [0])] == [
        "uniform", "sera", spec.NULL]



# ----------------------------------------------------------------------------- end to end


@pytest.fixture(scope="module")
def tiny_lm_study(tmp_path_factory):
    """The math default's protocol on a tiny random 2-layer LM (a byte tokenizer, written as a
    Hugging Face checkpoint): pre-registration, the start scored at every point, uniform /
    SERA / null over 4 steps, the aggregate and the export, on the suite's 8 host devices
    (a tiny model: the SmolLM2 version of this test ran out of memory there)."""
    from flax import nnx

    from sera_jax.models.decoder import Decoder, DecoderConfig
    from sera_jax.models.weights import save_hf_checkpoint
    from sera_jax.studies.paired import study

    policy = str(tmp_path_factory.mktemp("tiny_lm"))
    vocab = util.write_byte_tokenizer(policy)
    save_hf_checkpoint(Decoder(DecoderConfig(vocab_size=vocab, hidden_size=32,
                                             intermediate_size=64, num_layers=2, num_heads=2,
                                             num_kv_heads=1, qkv_bias=True, name="tiny"),
                               rngs=nnx.Rngs(0)), policy, model_type="qwen2")
    cfg = load("math/smollm2_arith_quick.py")
    cfg.name = "math_tiny_test"
    cfg.model.source, cfg.model.path = "hf", policy
    cfg.task.update(num_train=8, num_eval=8, chat=False, max_new_tokens=4)
    cfg.rl.update(num_steps=4, prompts_per_step=4, rollouts_per_prompt=2, micro_batch_size=8,
                  checkpoint_every=2, log_every=1)
    cfg.rl.allocation.n_max = 4
    cfg.rl.optimizer.learning_rate = 1e-3
    cfg.eval.update(every=2, num_prompts=8, train_prompts=4, num_samples=4, curve_samples=4,
                    batch_size=16)
    cfg.compare.primary.k = 4
    cfg.compare.bootstrap = 200
    cfg.compare.allow_blind_task = True  # a random policy cannot beat the blind guesser
    root = tmp_path_factory.mktemp("lm_study")
    cfg.compare.preregistration = str(root / "preregistration.json")
    work = str(root / "w")
    study.run(cfg, work, "preregister")
    study.run(cfg, work, "sft")
    study.run(cfg, work, "rl")
    table = study.run(cfg, work, "eval")
    from sera_jax.studies.paired.export import export_results

    export = export_results(cfg, work, out_dir=str(root / "export"))
    return cfg, work, table, export


@pytest.mark.slow
def test_lm_study_end_to_end_at_tiny_size(tiny_lm_study):
    from sera_jax.records import read_jsonl
    from sera_jax.studies.paired import recompute, study, tables

    cfg, work, table, export = tiny_lm_study
    assert table["study"] == "math" and set(table["methods"]) == {"uniform", "sera", "null"}
    assert table["null_control"]["ran"] and table["preregistration"]["hash_matches"]
    # The answer-blind control beside the start (exact pass@k from the training answers).
    assert set(table["blind"]["pass_at_k"]) == set(table["sft"]["pass_at_k"])
    assert table["validity"]["override"] or table["validity"]["passes"]
    # The start is the pretrained policy at step 0, scored at every point with its keys.
    assert {"answer_length", "truncated_fraction"} <= set(table["sft"])
    assert table["curves"]["steps"] == [0, 2, 4]
    train = read_jsonl(os.path.join(spec.run_dir(work, "sera", 0), "train.jsonl"))
    assert [r["step"] for r in train] == [1, 2, 3, 4]
    assert [r["rollouts"] for r in train] == [8, 16, 24, 32]  # P x N0 spent every step
    md = tables.comparison_markdown(table)
    assert "problem" in md and "maze" not in md.lower()
    # The numbers of this study before the protocol moved into its own package.
    golden.check_same_numbers(export["dir"], "math_tiny")
    # The export recomputes to the last value; a finished run re-run is a no-op.
    out = recompute.recompute(export["dir"])
    saved = json.load(open(os.path.join(export["dir"], "comparison.json")))
    assert recompute.compare_numbers(out["comparison"], {
        k: v for k, v in saved.items() if k != "preregistration"}, tol=1e-12) == []
    files = [os.path.join(spec.run_dir(work, m, 0), f) for m in ("uniform", "sera", "null")
             for f in ("train.jsonl", "eval.jsonl")]
    before = [open(f).read() for f in files]
    study.run(cfg, work, "rl")  # every run finished: resumed at its last step, nothing added
    assert [open(f).read() for f in files] == before
