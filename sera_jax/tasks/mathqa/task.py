"""`MathTask`: math word problems as an RL task (prompts + math-verify reward).

A prompt is the problem text with the model family's instruction suffix
(`data.PROMPT_TEMPLATES`), wrapped in the tokenizer's chat template when `chat=True`; all
prompts are tokenised once at construction. The reward of a completion is
`grader.grade(decoded text, gold, truncated)`: 1 iff the answer (the last complete
`\\boxed{}`, else the rightmost mathematical item: the rules A1-A4 of `grader`) is equivalent
to the gold answer and the completion was not cut by the length cap. `extract_answers`
gives canonical answer keys for majority voting.

Generation stops at the tokenizer's stop tokens (eos, `<|im_end|>`, ...); with
`stop_at_newline=True` also at every vocabulary token whose decoded text contains a newline
(`newline_token_ids`), so a one-line answer ("71") ends at its line break instead of running
on to the token cap. The stop token is kept in the completion; the grader reads the text.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import ml_collections
import numpy as np
from absl import logging
from ml_collections import config_dict

from sera_jax.models.tokenizer import Tokenizer
from sera_jax.tasks.base import RLTask
from sera_jax.tasks.mathqa import grader
from sera_jax.tasks.mathqa.data import MathProblem, format_prompt, load_problems
from sera_jax.tasks.mathqa.problems import fewshot_keys, fewshot_turns, generate_arithmetic

SOURCES = ("arithmetic", "files")


def newline_token_ids(tokenizer: Tokenizer) -> tuple[int, ...]:
    """Ids of every vocabulary entry whose decoded text (alone) contains a newline, sorted
    (129 of SmolLM2's 49,152: "\\n", "\\n\\n", ".\\n", ...)."""
    texts = tokenizer.tok.decode_batch([[i] for i in range(tokenizer.vocab_size)],
                                       skip_special_tokens=False)
    return tuple(i for i, text in enumerate(texts) if "\n" in text)


class MathTask(RLTask):
    """Math problems per split ('train', 'eval', ...) with a verified binary reward.

    Prompt ids are positions in each split's problem list (stable for the same data and
    arguments). Prompts longer than `max_prompt_len` tokens (when given) are dropped before
    ids are assigned, deterministically, and the number dropped is logged.
    """

    def __init__(
        self,
        splits: Mapping[str, Sequence[MathProblem]],
        tokenizer: Tokenizer,
        *,
        template: str = "smollm",
        chat: bool = True,
        system: str | None = None,
        max_new_tokens: int = 512,
        max_prompt_len: int | None = None,
        grade_timeout_s: int = 5,
        stop_at_newline: bool = False,
        fewshot: Sequence[tuple[str, str]] = (),
    ):
        if not isinstance(stop_at_newline, bool | np.bool_):
            raise TypeError(f"stop_at_newline={stop_at_newline!r} must be True or False, got "
                            f"{type(stop_at_newline).__name__}")
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens={max_new_tokens} must be >= 1")
        if max_prompt_len is not None and max_prompt_len < 1:
            raise ValueError(f"max_prompt_len={max_prompt_len} must be >= 1 (or None)")
        if grade_timeout_s < 1:
            raise ValueError(f"grade_timeout_s={grade_timeout_s} must be a whole number >= 1")
        self.tokenizer = tokenizer
        self.template, self.chat, self.system = template, bool(chat), system
        if fewshot and not chat:
            raise ValueError("fewshot turns need chat=True (they are earlier chat turns)")
        self.fewshot = tuple((str(q), str(a)) for q, a in fewshot)
        self.grade_timeout_s = int(grade_timeout_s)
        self.pad_id = int(tokenizer.pad_id)
        self.stop_at_newline = bool(stop_at_newline)
        self.stop_ids = tuple(int(s) for s in tokenizer.stop_ids)
        if self.stop_at_newline:
            self.stop_ids = tuple(sorted(set(self.stop_ids) | set(newline_token_ids(tokenizer))))
        self.max_new_tokens = int(max_new_tokens)
        self._problems: dict[str, list[MathProblem]] = {}
        self._tokens: dict[str, list[np.ndarray]] = {}
        for split, problems in splits.items():
            kept, tokens = [], []
            encoded = tokenizer.encode_batch([self.prompt_text(p) for p in problems])
            for p, ids in zip(problems, encoded):
                if max_prompt_len is None or len(ids) <= max_prompt_len:
                    kept.append(p)
                    tokens.append(ids.astype(np.int32))
            if len(kept) < len(problems):
                logging.warning("split %r: dropped %d of %d prompts longer than %d tokens",
                                split, len(problems) - len(kept), len(problems), max_prompt_len)
            if not kept:
                raise ValueError(f"split {split!r} has no problems (after max_prompt_len="
                                 f"{max_prompt_len})")
            self._problems[split], self._tokens[split] = kept, tokens
        self.max_prompt_len = max(len(t) for ts in self._tokens.values() for t in ts)

    # ------------------------------------------------------------------ prompts

    def prompt_text(self, problem: MathProblem) -> str:
        """The exact text the model sees before its answer (chat-formatted when `chat`; the
        few-shot (question, answer) pairs come first as earlier user / assistant turns, each
        question in the same template)."""
        text = format_prompt(problem.question, self.template)
        if not self.chat:
            return text
        turns = []
        for question, answer in self.fewshot:
            turns += [{"role": "user", "content": format_prompt(question, self.template)},
                      {"role": "assistant", "content": answer}]
        return self.tokenizer.chat_prompt(turns + [{"role": "user", "content": text}],
                                          system=self.system)

    @property
    def splits(self) -> tuple[str, ...]:
        return tuple(self._problems)

    def _split(self, split: str) -> list[MathProblem]:
        if split not in self._problems:
            raise ValueError(f"split={split!r} is not one of {self.splits}")
        return self._problems[split]

    def problems(self, split: str) -> list[MathProblem]:
        """The problems of a split, indexed by prompt id."""
        return list(self._split(split))

    def split_size(self, split: str) -> int:
        return len(self._split(split))

    def prompt_tokens(self, split: str, ids: Sequence[int]) -> list[np.ndarray]:
        self._split(split)
        return [self._tokens[split][int(i)] for i in ids]

    # ------------------------------------------------------------------ verification

    def _texts(self, completions: Sequence[np.ndarray]) -> list[str]:
        # Special tokens (the stop token) are not part of the answer text.
        return [self.tokenizer.decode(c, skip_special_tokens=True) for c in completions]

    def score(
        self,
        split: str,
        ids: Sequence[int],
        completions: Sequence[np.ndarray],
        truncated: np.ndarray,
    ) -> np.ndarray:
        """1.0 iff completion i's answer is equivalent to the gold answer of prompt ids[i]
        and it was not truncated (math-verify; never raises)."""
        problems = self._split(split)
        if not len(ids) == len(completions) == len(truncated):
            raise ValueError(f"ids ({len(ids)}), completions ({len(completions)}) and truncated "
                             f"({len(truncated)}) must have the same length")
        golds = [problems[int(i)].answer for i in ids]
        return grader.grade_batch(self._texts(completions), golds, np.asarray(truncated, bool),
                                  timeout_s=self.grade_timeout_s)

    def _is_truncated(self, completion: np.ndarray) -> bool:
        # The hook gets no flags: a completion is cut when it fills the budget without a stop.
        return len(completion) >= self.max_new_tokens and (
            len(completion) == 0 or int(completion[-1]) not in self.stop_ids)

    def extract_answers(
        self, split: str, ids: Sequence[int], completions: Sequence[np.ndarray]
    ) -> list[str | None]:
        """Canonical answer keys (`grader.answer_key`) for majority voting; truncated
        completions abstain (their reward is 0 whatever they say)."""
        self._split(split)
        return [
            grader.answer_key(text, truncated=self._is_truncated(c),
                              timeout_s=self.grade_timeout_s)
            for text, c in zip(self._texts(completions), completions)
        ]

    def decode(self, tokens: Sequence[int]) -> str:
        return self.tokenizer.decode(tokens)


def task_config() -> ml_collections.ConfigDict:
    """Defaults of the `task` block of a math experiment config (see `task_from_config`).

    Optional fields, read with their defaults when absent (so the configs and
    pre-registrations made before them hash as they did): `fewshot` ('' = none; a key of
    `problems.FEWSHOT`: worked examples as earlier chat turns), `num_test` (0 = none; a
    sealed test split of that many arithmetic problems whose content hash lies in
    [0.25, 0.25 + `sealed_fraction`), disjoint in content from train and held-out) and
    `sealed_fraction` (0.25)."""
    c = ml_collections.ConfigDict()
    c.source = "arithmetic"  # 'arithmetic' (embedded generator) | 'files'
    # Generated arithmetic problems.
    c.num_train = 64
    c.num_eval = 32
    c.seed = 0
    c.steps = (1, 2, 3)
    c.templates = ""  # comma-separated subset of problems.TEMPLATE_NAMES; '' = all
    # User files (GSM8K- or MATH-style JSONL / Parquet; a file or a directory each).
    c.train_path = ""
    c.eval_path = ""
    c.format = "auto"  # 'auto' | 'gsm8k' | 'math'
    c.train_levels = config_dict.placeholder(tuple)
    c.eval_levels = config_dict.placeholder(tuple)
    c.train_limit = 0  # 0 = all
    c.eval_limit = 0
    # Prompting.
    c.template = "smollm"  # key of data.PROMPT_TEMPLATES
    c.chat = True
    c.system = config_dict.placeholder(str)  # None: model default
    c.max_new_tokens = 512
    c.max_prompt_len = 0  # 0 = no cap (longer prompts are dropped when set)
    c.grade_timeout_s = 5
    # True: also stop at every token whose text contains a newline (one-line answers).
    c.stop_at_newline = False
    return c


def load_splits(cfg: ml_collections.ConfigDict) -> dict[str, list[MathProblem]]:
    """`{'train': [...], 'eval': [...]}` from the task config (generated or from files)."""
    if cfg.source == "arithmetic":
        names = [t.strip() for t in str(cfg.get("templates") or "").split(",") if t.strip()]
        num_test = int(cfg.get("num_test", 0) or 0)
        data = generate_arithmetic(
            int(cfg.num_train), int(cfg.num_eval), seed=int(cfg.seed), steps=tuple(cfg.steps),
            templates=names or None, num_sealed=num_test,
            sealed_fraction=float(cfg.get("sealed_fraction", 0.25)) if num_test else 0.0,
            exclude=fewshot_keys(str(cfg.get("fewshot", "") or "")))
        out = {"train": data["train"], "eval": data["test"]}
        return {**out, "test": data["sealed"]} if num_test else out
    if cfg.source == "files":
        out = {}
        for split in ("train", "eval"):
            path = cfg.get(f"{split}_path")
            if not path:
                raise ValueError(f"config.task.{split}_path is empty; with source='files' give a "
                                 "GSM8K/MATH .jsonl/.parquet file or directory")
            limit = int(cfg.get(f"{split}_limit") or 0) or None
            out[split] = load_problems(path, fmt=cfg.format, levels=cfg.get(f"{split}_levels"),
                                       limit=limit)
        return out
    raise ValueError(f"config.task.source={cfg.source!r} is not one of {SOURCES}")


def task_from_config(cfg: ml_collections.ConfigDict, tokenizer: Tokenizer) -> MathTask:
    """The `MathTask` described by a `task_config()`-shaped block."""
    return MathTask(
        load_splits(cfg), tokenizer, template=cfg.template, chat=cfg.chat, system=cfg.system,
        max_new_tokens=int(cfg.max_new_tokens),
        max_prompt_len=int(cfg.max_prompt_len) or None,
        grade_timeout_s=int(cfg.grade_timeout_s),
        stop_at_newline=cfg.get("stop_at_newline", False),
        fewshot=fewshot_turns(str(cfg.get("fewshot", "") or "")),
    )
