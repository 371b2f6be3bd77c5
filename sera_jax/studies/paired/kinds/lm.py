"""The math kind: a pretrained language model (its start) answering verified math problems.

A config whose `model` block names a `source` (`'embedded'` SmolLM2-135M-Instruct, a GGUF file
or a Hugging Face directory: `sera_jax.models.policy`) and whose `task` block is a
`mathqa.task.task_config()` is a paired study on math problems. What differs from the maze:

* the start is the pretrained policy itself (no SFT: its step is 0, and the start folder holds
  its scoring at every evaluation point, with that point's keys);
* the task needs the model's tokenizer, so it is built from the loaded model source;
* the blind control is an answer-blind guesser: it ignores the problem and draws an answer
  from the training problems' gold answers at their frequency, so its exact pass@k on
  held-out problem m is `1 - (1 - q_m)^k`, q_m = the share of training problems whose answer
  equals m's (the same distribution-matching guesser as the maze's).
"""

from __future__ import annotations

import collections
import functools
import json
from collections.abc import Sequence
from typing import Any

import jax
import ml_collections
import numpy as np

from sera_jax import loop, validation
from sera_jax import sharding as shd
from sera_jax.models.configs import DTYPE_NAMES
from sera_jax.models.decoder import Decoder
from sera_jax.models.policy import MODEL_SOURCES, load_policy, load_policy_tokenizer
from sera_jax.rl.evaluate import prompt_slots
from sera_jax.sampling import SamplingConfig, generate_rows, left_pad
from sera_jax.studies import common
from sera_jax.studies.paired.kinds.base import Kind, Words, blind_pass_at_k, register
from sera_jax.tasks.mathqa.data import FORMATS, PROMPT_TEMPLATES
from sera_jax.tasks.mathqa.problems import TEMPLATE_NAMES
from sera_jax.tasks.mathqa.task import SOURCES, MathTask, task_from_config

#: Model options left out of fingerprints at their default (added after the first runs):
#: the layers' layout computes the same function (to float32 tolerance).
MODEL_DEFAULTS = {"scan_layers": False}
WORDS = Words(
    prompt="problem", prompts="problems", start="start", start_long="pretrained start",
    start_row="start (step-{step} keys)",
    blind="answer-blind",
    blind_policy="a policy that ignores the problem and answers with each training "
                 "problem's answer at its frequency",
    blind_note="each training answer at its training frequency, whatever the problem",
    reads="reads the problem", seen="answers of training problems",
    published="published evaluation")


@functools.lru_cache(maxsize=2)
def _tokenizer(model_json: str):
    return load_policy_tokenizer(ml_collections.ConfigDict(json.loads(model_json)))


def tokenizer_of(cfg: ml_collections.ConfigDict):
    """The tokenizer of `cfg.model` (cached per process: building the task needs it)."""
    return _tokenizer(json.dumps(cfg.model.to_dict(), sort_keys=True))


def validate_model(cfg: ml_collections.ConfigDict) -> None:
    """The `model` block of a pretrained policy: source, path, dtypes (StudyError naming the
    field); used by `math_pilot` too."""
    c, m = common.check, cfg.model
    c(m.source in MODEL_SOURCES, "model.source", m.source, f"one of {MODEL_SOURCES}")
    c(m.source == "embedded" or bool(m.path), "model.path", m.path,
      "a GGUF file (source 'gguf') or a Hugging Face directory (source 'hf')")
    for field in ("dtype", "param_dtype"):
        c(m[field] in DTYPE_NAMES, f"model.{field}", m[field], f"one of {DTYPE_NAMES}")


def validate_task(cfg: ml_collections.ConfigDict) -> None:
    """The `task` block (`mathqa.task.task_config`) and the batch it must fill: P =
    `rl.prompts_per_step` distinct training problems per step, so `task.num_train` (or
    `task.train_limit` for files) >= P. StudyError naming the field."""
    c = common.check
    t = cfg.task
    is_int, pos = validation.is_int, validation.is_positive_int
    c(t.source in SOURCES, "task.source", t.source, f"one of {SOURCES}")
    p = cfg.rl.prompts_per_step
    if t.source == "arithmetic":
        for field in ("num_train", "num_eval"):
            c(pos(t[field]), f"task.{field}", t[field], "an integer >= 1")
        c(is_int(t.seed), "task.seed", t.seed, "an integer")
        c(isinstance(t.steps, tuple | list) and len(t.steps) > 0 and all(
            pos(x) for x in t.steps), "task.steps", t.steps, "a tuple of integers >= 1")
        names = [x.strip() for x in str(t.templates or "").split(",") if x.strip()]
        c(isinstance(t.templates, str) and set(names) <= set(TEMPLATE_NAMES), "task.templates",
          t.templates, f"'' (all) or a comma-separated subset of {TEMPLATE_NAMES}")
        c(not pos(p) or p <= t.num_train, "task.num_train", t.num_train,
          f">= rl.prompts_per_step={p} (each step takes P distinct training problems)")
    else:
        for split in ("train", "eval"):
            path = t[f"{split}_path"]
            c(isinstance(path, str) and bool(path), f"task.{split}_path", path,
              "a GSM8K/MATH .jsonl/.parquet file or directory (source 'files')")
            c(is_int(t[f"{split}_limit"]) and t[f"{split}_limit"] >= 0, f"task.{split}_limit",
              t[f"{split}_limit"], "an integer >= 0 (0 = all)")
            levels = t[f"{split}_levels"]
            c(levels is None or (isinstance(levels, tuple | list) and all(
                is_int(x) for x in levels)), f"task.{split}_levels", levels,
              "None (all) or a tuple of integer levels")
        c(t.format in FORMATS, "task.format", t.format, f"one of {FORMATS}")
        c(not (pos(p) and t.train_limit) or p <= t.train_limit, "task.train_limit",
          t.train_limit, f"0 (all) or >= rl.prompts_per_step={p}")
    c(t.template in PROMPT_TEMPLATES, "task.template", t.template,
      f"one of {sorted(PROMPT_TEMPLATES)}")
    c(validation.is_bool(t.chat), "task.chat", t.chat, "True or False")
    c(validation.is_bool(t.get("stop_at_newline", False)), "task.stop_at_newline",
      t.get("stop_at_newline"), "True or False")
    c(t.system is None or isinstance(t.system, str), "task.system", t.system,
      "None (the model's default) or a string")
    c(pos(t.max_new_tokens), "task.max_new_tokens", t.max_new_tokens, "an integer >= 1")
    c(is_int(t.max_prompt_len) and t.max_prompt_len >= 0, "task.max_prompt_len",
      t.max_prompt_len, "an integer >= 0 (0 = no cap)")
    c(pos(t.grade_timeout_s), "task.grade_timeout_s", t.grade_timeout_s, "an integer >= 1")


def eval_sampling(cfg: ml_collections.ConfigDict, task: MathTask) -> SamplingConfig:
    """The evaluation sampler: `eval.temperature` / `eval.top_p` / `eval.top_k`, the task's
    length cap (`eval.max_new_tokens` when > 0), stop and pad ids (the newline tokens too
    when `task.stop_at_newline`: they are among the task's stop ids)."""
    e = cfg.eval
    return SamplingConfig(
        max_new_tokens=int(e.max_new_tokens) or task.max_new_tokens, temperature=e.temperature,
        top_p=e.top_p, top_k=e.top_k, greedy=e.temperature == 0,
        stop_ids=tuple(task.stop_ids), pad_id=task.pad_id,
        cache_dtype=e.get("kv_cache_dtype", "") or None)


def sample_examples(model: Decoder, task: MathTask, cfg: ml_collections.ConfigDict,
                    mesh: jax.sharding.Mesh | None, count: int = 3) -> list[dict[str, Any]]:
    """What the policy writes: one decoded completion (with its reward) of each of the first
    `count` held-out problems, at the evaluation sampler (`eval_sampling`) with the key
    `eval.seed + 1`: {"id", "question", "gold", "completion", "reward", "truncated"}.

    Laid out as a chunk of an evaluation of the first `eval.num_prompts` problems x
    `eval.num_samples` samples (its width and prompt slots, the ids repeated to fill it), so
    on one batch shard the evaluation's compiled sampler is reused; problem i is reported
    from its first row."""
    e = cfg.eval
    num_prompts = min(int(e.num_prompts), task.split_size("eval"))
    ids = list(range(min(int(count), num_prompts)))
    if not ids:
        return []
    batch = shd.round_up_to_shards(int(e.batch_size), mesh)
    width = shd.round_up_to_shards(min(batch, num_prompts * int(e.num_samples)), mesh)
    n = max(1, min(int(e.num_samples), width // len(ids)))
    slots = -(-width // n)  # distinct prompts of an evaluation chunk of `width` rows
    toks, mask = left_pad(task.prompt_tokens("eval", [ids[j % len(ids)] for j in range(slots)]),
                          task.max_prompt_len, task.pad_id)
    row_prompt = np.arange(width) // n
    key = jax.random.key(int(e.seed) + 1)
    keys = jax.vmap(lambda i: jax.random.fold_in(key, i))(jax.numpy.arange(width,
                                                                         dtype=jax.numpy.uint32))
    out = generate_rows(model, toks, mask, row_prompt, keys, eval_sampling(cfg, task),
                        rows_per_call=width, mesh=mesh,
                        prompt_slots=max(slots, prompt_slots(num_prompts, width, n)))
    first = np.arange(len(ids)) * n  # the first row of each id
    tokens, lengths, truncated = out.tokens[first], out.lengths[first], out.truncated[first]
    comps = [tokens[i, : lengths[i]] for i in range(len(ids))]
    rewards = task.score("eval", ids, comps, truncated)
    problems = task.problems("eval")
    return [{"id": q, "question": problems[q].question, "gold": problems[q].answer,
             "completion": task.tokenizer.decode(c, skip_special_tokens=True),
             "reward": float(r), "truncated": bool(t)}
            for q, c, r, t in zip(ids, comps, rewards, truncated)]


def answer_key(answer: str) -> str:
    """The answer's identity for the blind guesser: its text without spaces and commas
    ("1,200" and "1200" are one answer)."""
    return str(answer).replace(" ", "").replace(",", "")


def blind_validity(task: Any, split: str, num_prompts: int, ks: Sequence[int]
                   ) -> dict[str, Any]:
    """What an answer-blind guesser gets on the first `num_prompts` problems of `split`
    (module docstring): `blind_pass_at_k`, `blind_q`, `distinct_answers` (held-out),
    `distinct_sft_answers` (the training answers it draws from), `seen_in_sft` (the share of
    held-out answers that are also training answers), `num_prompts` and
    `median_answer_chars`."""
    train = [answer_key(p.answer) for p in task.problems("train")]
    freq = collections.Counter(train)
    n = min(int(num_prompts), task.split_size(split))
    held = [answer_key(p.answer) for p in task.problems(split)[:n]]
    q = np.asarray([freq.get(a, 0) / len(train) for a in held], np.float64)
    return {"split": split, "kind": "math", "num_prompts": n,
            "blind_pass_at_k": blind_pass_at_k(q, ks), "blind_q": q.tolist(),
            "distinct_answers": len(set(held)), "distinct_sft_answers": len(freq),
            "seen_in_sft": float(np.mean([a in freq for a in held])) if held else 0.0,
            "median_answer_chars": float(np.median([len(a) for a in held])) if held else 0.0}


@register
class MathKind(Kind):
    """Math problems (`sera_jax.tasks.mathqa`, splits train / eval) for a pretrained LM."""

    name = "math"
    words = WORDS
    binary = "experiments.math_rl"

    def validate(self, cfg: ml_collections.ConfigDict) -> None:
        c, m = common.check, cfg.model
        validate_model(cfg)
        c(m.get("init_checkpoint", "") in ("", None), "model.init_checkpoint",
          m.get("init_checkpoint"), "'' (the paired study starts from the pretrained policy)")
        validate_task(cfg)
        e = cfg.eval
        c(isinstance(e.top_p, int | float) and 0 < e.top_p <= 1, "eval.top_p", e.top_p,
          "a number in (0, 1]")
        c(isinstance(e.top_k, int) and e.top_k >= 0, "eval.top_k", e.top_k, "an integer >= 0")
        c(isinstance(e.max_new_tokens, int) and e.max_new_tokens >= 0, "eval.max_new_tokens",
          e.max_new_tokens, "an integer >= 0 (0 = task.max_new_tokens)")

    def build_task(self, cfg: ml_collections.ConfigDict) -> MathTask:
        """The `MathTask` of `cfg.task` with the tokenizer of `cfg.model`."""
        return task_from_config(cfg.task, tokenizer_of(cfg))

    def build_model(self, cfg: ml_collections.ConfigDict, mesh: jax.sharding.Mesh | None = None
                    ) -> Decoder:
        """The pretrained start policy of `cfg.model` (loaded afresh: RL trains a copy)."""
        return load_policy(cfg.model, mesh)[0]

    def eval_sampling(self, cfg: ml_collections.ConfigDict, task: Any) -> SamplingConfig:
        return eval_sampling(cfg, task)

    def start_fingerprint(self, cfg: ml_collections.ConfigDict) -> dict[str, Any]:
        """Task and model (there is no SFT)."""
        return {"task": cfg.task.to_dict(),
                "model": loop.trim_fields(cfg.model.to_dict(), defaults=MODEL_DEFAULTS)}

    def train_start(self, cfg: ml_collections.ConfigDict, start_dir: str, mesh: Any,
                    workdir: str) -> tuple[Any, int]:
        return None, 0  # the pretrained policy is the start: nothing to train

    def load_start(self, cfg: ml_collections.ConfigDict, start_dir: str, mesh: Any = None
                   ) -> tuple[Any, int]:
        return self.build_model(cfg, mesh), 0

    def start_step(self, cfg: ml_collections.ConfigDict, start_dir: str) -> int | None:
        return 0

    def blind_validity(self, task: Any, split: str, num_prompts: int, ks: Sequence[int]
                       ) -> dict[str, Any]:
        return blind_validity(task, split, num_prompts, ks)
