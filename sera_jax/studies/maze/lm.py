"""The paired study on a pretrained language model (issue 38): the math task kind.

The study's stages, controls, pre-registration, curves, frontier and export are written for
any policy whose start is scored at every evaluation point. A config whose `model` block
names a `source` (`'embedded'` SmolLM2-135M-Instruct, a GGUF file or a Hugging Face
directory: `sera_jax.models.policy`) and whose `task` block is a `mathqa.task.task_config()`
is such a study on math problems; everything below is what differs from the maze:

* the start is the pretrained policy itself (no SFT: its "step" is 0, and `sft/` holds the
  start's scoring at every evaluation point, with that point's keys);
* the task needs the model's tokenizer, so it is built from the loaded model source;
* the blind control (`blind_validity`) is an answer-blind guesser: it ignores the problem
  and draws an answer from the training problems' gold answers at their frequency, so its
  exact pass@k on held-out problem m is `1 - (1 - q_m)^k`, q_m = the share of training
  problems whose answer equals m's (the same distribution-matching guesser as the maze's).
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

from sera_jax import loop
from sera_jax.models.decoder import Decoder
from sera_jax.sampling import SamplingConfig
from sera_jax.studies import common
from sera_jax.studies.maze.blind import blind_pass_at_k


def is_lm(cfg: ml_collections.ConfigDict) -> bool:
    """True when the study starts from a pretrained LM (`config.model.source` is set)."""
    return cfg.model.get("source") is not None


def study_name(cfg: ml_collections.ConfigDict) -> str:
    """The results folder of a study: `results/<study_name>/<config.name>/`."""
    return "math" if is_lm(cfg) else "maze"


@functools.lru_cache(maxsize=2)
def _tokenizer(model_json: str):
    from sera_jax.models import embedded
    from sera_jax.models.policy import SMOLLM2_MISSING
    from sera_jax.models.tokenizer import from_gguf, load_tokenizer

    m = json.loads(model_json)
    if m.get("tokenizer_path"):
        return load_tokenizer(m["tokenizer_path"])
    if m["source"] == "embedded":
        try:
            return from_gguf(embedded.smollm2_gguf_path())
        except FileNotFoundError as e:
            raise FileNotFoundError(SMOLLM2_MISSING) from e
    return load_tokenizer(m["path"])


def build_task(cfg: ml_collections.ConfigDict):
    """The `MathTask` of `cfg.task` with the tokenizer of `cfg.model` (cached per process)."""
    from sera_jax.tasks.mathqa.task import task_from_config

    return task_from_config(cfg.task, _tokenizer(json.dumps(cfg.model.to_dict(),
                                                            sort_keys=True)))


def build_model(cfg: ml_collections.ConfigDict, mesh: jax.sharding.Mesh | None = None
                ) -> Decoder:
    """The pretrained start policy of `cfg.model` (loaded afresh: RL trains a copy)."""
    from sera_jax.models.policy import load_policy

    return load_policy(cfg.model, mesh)[0]


def model_fingerprint(cfg: ml_collections.ConfigDict) -> dict[str, Any]:
    from sera_jax.studies.math_reasoning import MODEL_DEFAULTS

    return loop.trim_fields(cfg.model.to_dict(), defaults=MODEL_DEFAULTS)


def eval_sampling(cfg: ml_collections.ConfigDict, task: Any) -> SamplingConfig:
    """The evaluation sampler (`math_reasoning.eval_sampling`: temperature, top-p, top-k,
    the task's cap, stop ids with the newline tokens when `task.stop_at_newline`)."""
    from sera_jax.studies.math_reasoning import eval_sampling as math_eval_sampling

    return math_eval_sampling(cfg, task)


def validate(cfg: ml_collections.ConfigDict) -> None:
    """The model and task blocks of an LM study (StudyError naming the field)."""
    from sera_jax.studies.math_reasoning import validate_model, validate_task

    c, m = common.check, cfg.model
    validate_model(cfg)
    c(m.get("init_checkpoint", "") in ("", None), "model.init_checkpoint",
      m.get("init_checkpoint"), "'' (the paired study starts from the pretrained policy)")
    validate_task(cfg)
    e = cfg.eval
    for field in ("top_p",):
        c(isinstance(e[field], int | float) and 0 < e[field] <= 1, f"eval.{field}", e[field],
          "a number in (0, 1]")
    c(isinstance(e.top_k, int) and e.top_k >= 0, "eval.top_k", e.top_k, "an integer >= 0")
    c(isinstance(e.max_new_tokens, int) and e.max_new_tokens >= 0, "eval.max_new_tokens",
      e.max_new_tokens, "an integer >= 0 (0 = task.max_new_tokens)")


def answer_key(answer: str) -> str:
    """The answer's identity for the blind guesser: its text without spaces and commas
    ("1,200" and "1200" are one answer)."""
    return str(answer).replace(" ", "").replace(",", "")


def blind_validity(task: Any, split: str, num_prompts: int, ks: Sequence[int]
                   ) -> dict[str, Any]:
    """What an answer-blind guesser gets on the first `num_prompts` problems of `split`
    (module docstring), with the maze report's keys: `blind_pass_at_k`, `blind_q`,
    `distinct_answers` (held-out), `distinct_sft_answers` (training answers it draws from),
    `seen_in_sft` (the share of held-out answers that are also training answers),
    `num_mazes` (= problems), `size` (None) and `median_moves` (median answer length in
    characters)."""
    train = [answer_key(p.answer) for p in task.problems("train")]
    freq = collections.Counter(train)
    n = min(int(num_prompts), task.split_size(split))
    held = [answer_key(p.answer) for p in task.problems(split)[:n]]
    q = np.asarray([freq.get(a, 0) / len(train) for a in held], np.float64)
    return {"split": split, "num_mazes": n, "size": None, "kind": "math",
            "blind_pass_at_k": blind_pass_at_k(q, ks), "blind_q": q.tolist(),
            "distinct_answers": len(set(held)), "distinct_sft_answers": len(freq),
            "seen_in_sft": float(np.mean([a in freq for a in held])) if held else 0.0,
            "median_moves": float(np.median([len(a) for a in held])) if held else 0.0}


#: The maze tables' wording and what it means on a math study (`relabel`), most specific
#: first: the blind control's description, then the nouns.
RELABEL = (
    ("a policy that ignores the maze and emits each SFT answer at its SFT frequency",
     "a policy that ignores the problem and answers with each training problem's answer at "
     "its frequency"),
    ("each SFT answer at its SFT frequency, whatever the maze",
     "each training answer at its training frequency, whatever the problem"),
    ("published maze evaluation", "published evaluation"), ("SFT (start, ", "start ("),
    ("maze-blind", "answer-blind"), ("mazes", "problems"), ("maze", "problem"),
    ("SFT start", "pretrained start"), ("SFT", "start"),
)


def relabel(text: str) -> str:
    """A maze report's markdown in the math study's words (problems, the pretrained start,
    the answer-blind guesser); the numbers are untouched."""
    for old, new in RELABEL:
        text = text.replace(old, new)
    return text


__all__ = ["RELABEL", "answer_key", "blind_validity", "build_model", "build_task",
           "eval_sampling", "is_lm", "model_fingerprint", "relabel", "study_name", "validate"]
