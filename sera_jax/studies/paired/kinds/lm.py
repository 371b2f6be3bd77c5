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
  equals m's (the same distribution-matching guesser as the maze's). Three more guessers
  that may read the problem's template but never its numbers (the template's training
  answers at their frequency, uniform over the template's training answer range, the
  template's most frequent answer: `blind_guessers`) are reported beside it with the
  strongest of the four; `compare.blind = "strongest"` makes that one the control the
  validity gate reads (default "frequency": the guesser of every committed result).
"""

from __future__ import annotations

import collections
import functools
import json
import re
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
from sera_jax.tasks.mathqa.problems import FEWSHOT, TEMPLATE_NAMES
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
        num_test = t.get("num_test", 0)
        c(is_int(num_test) and num_test >= 0, "task.num_test", num_test,
          "an integer >= 0 (0 = no sealed test split)")
        frac = t.get("sealed_fraction", 0.25)
        c(isinstance(frac, int | float) and 0 < frac < 0.75, "task.sealed_fraction", frac,
          "a number in (0, 0.75): the content-hash band of the sealed split")
        fewshot = t.get("fewshot", "")
        c(fewshot in ("", *FEWSHOT), "task.fewshot", fewshot,
          f"'' (none) or one of {sorted(FEWSHOT)}")
        c(not fewshot or t.chat, "task.chat", t.chat, "True when task.fewshot is set (the "
          "examples are earlier chat turns)")
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


#: The sealed test split's fields: out of the start's fingerprint, in the evaluation's when
#: it is scored (`Kind.test_split`).
TEST_FIELDS = ("num_test", "sealed_fraction")
#: The answer-blind guessers of `blind_guessers`, in the order their ties are broken.
GUESSERS = ("frequency", "template_frequency", "uniform_range", "mode")
#: The values of `compare.blind`: the guesser the validity gate reads ("strongest": the best
#: of `GUESSERS`; "frequency", the default, is the guesser of the committed results).
BLIND_CHOICES = ("frequency", "strongest", *GUESSERS[1:])
_INT = re.compile(r"-?[0-9]+")


def _template_of(problem: Any) -> str | None:
    """The problem's template (visible in its wording, never its numbers); None = one pool
    for every problem without one."""
    return (getattr(problem, "meta", None) or {}).get("template")


def _uniform_range_q(pool: Sequence[str], gold: str) -> float:
    """One guess's success on `gold` when uniform over the integers [min, max] of the
    training answers `pool` (all integers), else over their distinct values."""
    if not pool:
        return 0.0
    if all(_INT.fullmatch(a) for a in pool):
        lo, hi = min(int(a) for a in pool), max(int(a) for a in pool)
        inside = _INT.fullmatch(gold) is not None and lo <= int(gold) <= hi
        return 1.0 / (hi - lo + 1) if inside else 0.0
    distinct = set(pool)
    return 1.0 / len(distinct) if gold in distinct else 0.0


def _mode(pool: Sequence[str]) -> str | None:
    """The most frequent answer of `pool`; ties: the smallest by string order."""
    counts = collections.Counter(pool)
    if not counts:
        return None
    top = max(counts.values())
    return min(a for a, c in counts.items() if c == top)


def blind_guessers(train: Sequence[Any], held: Sequence[Any]) -> dict[str, np.ndarray]:
    """{guesser: q} for the answer-blind guessers (`GUESSERS`), q_i = the probability that
    one guess equals the gold answer a_i of held-out problem i (answers compared by
    `answer_key`). T(i) is the training problems of i's template (`meta["template"]`; the
    problems without one are one pool, and a template no training problem has gives
    q_i = 0 under the three per-template guessers); N = the training problems.

    * "frequency": a training answer at its overall frequency, q_i = #{j in N: a_j = a_i} / |N|.
    * "template_frequency": a training answer of i's template at its frequency there,
      q_i = #{j in T(i): a_j = a_i} / |T(i)| (the guesser reads the template, which the
      prompt's wording shows, never the numbers).
    * "uniform_range": uniform over the integers lo..hi, the least and greatest training
      answer of T(i): q_i = 1 / (hi - lo + 1) when a_i is an integer in [lo, hi], else 0;
      when some answer of T(i) is not an integer, uniform over the distinct answers D(i)
      of T(i): q_i = 1 / |D(i)| when a_i is in D(i), else 0.
    * "mode": always the most frequent answer of T(i) (ties: the smallest by string order),
      q_i = 1 when a_i is it, else 0 (deterministic: its pass@k is its pass@1 at every k).
    """
    keys = [answer_key(p.answer) for p in train]
    pools: dict[str | None, list[str]] = collections.defaultdict(list)
    for p, a in zip(train, keys):
        pools[_template_of(p)].append(a)
    freq = collections.Counter(keys)
    tfreq = {t: collections.Counter(pool) for t, pool in pools.items()}
    modes = {t: _mode(pool) for t, pool in pools.items()}
    out: dict[str, list[float]] = {g: [] for g in GUESSERS}
    for p in held:
        gold, t = answer_key(p.answer), _template_of(p)
        pool = pools.get(t, [])
        out["frequency"].append(freq.get(gold, 0) / len(keys) if keys else 0.0)
        out["template_frequency"].append(tfreq[t].get(gold, 0) / len(pool) if pool else 0.0)
        out["uniform_range"].append(_uniform_range_q(pool, gold))
        out["mode"].append(float(pool != [] and modes[t] == gold))
    return {g: np.asarray(q, np.float64) for g, q in out.items()}


def blind_validity(task: Any, split: str, num_prompts: int, ks: Sequence[int],
                   blind: str = "frequency") -> dict[str, Any]:
    """What an answer-blind guesser gets on the first `num_prompts` problems of `split`.

    Every guesser of `blind_guessers` (its q_i, the probability that one guess is right on
    problem i) is scored: its exact pass@k is the mean over problems of `1 - (1 - q_i)^k`
    (`base.blind_pass_at_k`), its pass@1 the mean q_i; they are all reported (`guessers`:
    {name: {"blind_pass_at_k", "pass1"}}) with `strongest`, the one of highest pass@k at the
    largest k of `ks` (ties: the first in `GUESSERS`). The control (`blind_pass_at_k`,
    `blind_q`, and its name `blind`) is the guesser `blind` names: "frequency" (the default:
    the module docstring's guesser, that of every committed result), "strongest", or another
    name of `GUESSERS` (`compare.blind`). Also: `distinct_answers` (held-out),
    `distinct_sft_answers` (the training answers), `seen_in_sft` (the share of held-out
    answers that are also training answers), `num_prompts` and `median_answer_chars`."""
    if blind not in BLIND_CHOICES:
        raise ValueError(f"blind={blind!r} is not one of {BLIND_CHOICES}")
    train_problems = task.problems("train")
    n = min(int(num_prompts), task.split_size(split))
    held_problems = task.problems(split)[:n]
    qs = blind_guessers(train_problems, held_problems)
    guessers = {g: {"blind_pass_at_k": blind_pass_at_k(q, ks),
                    "pass1": float(q.mean()) if q.size else 0.0} for g, q in qs.items()}
    top = str(max(int(k) for k in ks)) if len(ks) else None
    strongest = max(GUESSERS, key=lambda g: (guessers[g]["blind_pass_at_k"][top] if top
                                             else guessers[g]["pass1"]))
    chosen = strongest if blind == "strongest" else blind
    q = qs[chosen]
    train = {answer_key(p.answer) for p in train_problems}
    held = [answer_key(p.answer) for p in held_problems]
    return {"split": split, "kind": "math", "num_prompts": n, "blind": chosen,
            "blind_pass_at_k": guessers[chosen]["blind_pass_at_k"], "blind_q": q.tolist(),
            "guessers": guessers, "strongest": strongest,
            "distinct_answers": len(set(held)), "distinct_sft_answers": len(train),
            "seen_in_sft": float(np.mean([a in train for a in held])) if held else 0.0,
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
        blind = (cfg.compare.get("blind") if "compare" in cfg else None) or "frequency"
        c(blind in BLIND_CHOICES, "compare.blind", blind,
          f"one of {BLIND_CHOICES} (the answer-blind guesser the validity gate reads)")

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
        """Task and model (there is no SFT); the sealed split's fields are left out (the
        start's other scorings do not depend on them)."""
        return {"task": loop.trim_fields(cfg.task.to_dict(), TEST_FIELDS),
                "model": loop.trim_fields(cfg.model.to_dict(), defaults=MODEL_DEFAULTS)}

    def test_split(self, cfg: ml_collections.ConfigDict) -> dict[str, Any] | None:
        """`{"num_test", "sealed_fraction"}` of generated problems with `task.num_test` > 0
        (the sealed split: a content-hash band of its own, `mathqa.problems`), else None."""
        num_test = int(cfg.task.get("num_test", 0) or 0)
        if num_test <= 0 or cfg.task.source != "arithmetic":
            return None
        return {"num_test": num_test,
                "sealed_fraction": float(cfg.task.get("sealed_fraction", 0.25))}

    def train_start(self, cfg: ml_collections.ConfigDict, start_dir: str, mesh: Any,
                    workdir: str) -> tuple[Any, int]:
        return None, 0  # the pretrained policy is the start: nothing to train

    def load_start(self, cfg: ml_collections.ConfigDict, start_dir: str, mesh: Any = None
                   ) -> tuple[Any, int]:
        return self.build_model(cfg, mesh), 0

    def start_step(self, cfg: ml_collections.ConfigDict, start_dir: str) -> int | None:
        return 0

    #: The values `compare.blind` may take for this kind (`validity.blind_choice`).
    blind_choices = BLIND_CHOICES

    def blind_validity(self, task: Any, split: str, num_prompts: int, ks: Sequence[int],
                       blind: str = "frequency") -> dict[str, Any]:
        """The answer-blind control (module-level `blind_validity`; `blind`: the guesser
        `compare.blind` names)."""
        return blind_validity(task, split, num_prompts, ks, blind)
