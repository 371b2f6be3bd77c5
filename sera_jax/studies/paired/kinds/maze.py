"""The maze kind: mazes read from a grid prompt, a policy trained from scratch (SFT on BFS
shortest paths) as the start, and the maze-blind control.

The maze-blind control is a policy that never reads the maze. It emits answer `a` with the
frequency `f_a` that `a` has among the SFT split's answers (the supervised shortest paths),
whatever the prompt. On a maze `m` it therefore succeeds with probability

    q_m = sum_a f_a * verify(m, a)                       (exact: every distinct answer checked)

and its pass@k on `m` is the closed form `1 - (1 - q_m)^k` — the expectation of the unbiased
pass@k estimator at any sample size, so it sits beside a policy's measured pass@k with no
sampling noise of its own. A task "requires reading the maze" only when a policy that reads
it scores far above this control (`paired.validity`).
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Sequence
from typing import Any

import jax
import ml_collections
import numpy as np
from flax import nnx

from sera_jax import loop
from sera_jax import sft as sft_lib
from sera_jax.checkpoint import Checkpointer
from sera_jax.models.configs import DTYPE_NAMES, dtype_from_name
from sera_jax.models.configs import get_config as get_model_config
from sera_jax.models.decoder import Decoder
from sera_jax.records import log_timing
from sera_jax.sampling import SamplingConfig
from sera_jax.studies import common
from sera_jax.studies.paired.kinds.base import (
    SPLIT_NAMES,
    Kind,
    Words,
    blind_pass_at_k,
    register,
)
from sera_jax.tasks import maze as maze_lib

#: Model options (added after the first runs) left out of fingerprints at their default, so
#: earlier runs resume and their cached evaluations stay valid (`loop.trim_fields`):
#: `model.dtype` (compute dtype; parameters and AdamW state stay float32) and
#: `model.scan_layers` (the layers' layout: the same function to float32 tolerance).
MODEL_DEFAULTS = {"dtype": "float32", "scan_layers": False}
#: `task.generator` (added after the first runs) is left out at its default, "prim", so a
#: config that names it and one written before it share fingerprints.
TASK_DEFAULTS = {"generator": "prim"}
#: The sealed test split's fields (`MazeTask`'s num_test / test_seed): out of the start's
#: fingerprint, in the evaluation's when it is scored (`Kind.test_split`).
TEST_FIELDS = ("num_test", "test_seed")
WORDS = Words(
    prompt="maze", prompts="mazes", start="SFT", start_long="SFT start",
    start_row="SFT (start, step-{step} keys)", blind="maze-blind",
    blind_policy="a policy that ignores the maze and emits each SFT answer at its SFT "
                 "frequency",
    blind_note="each SFT answer at its SFT frequency, whatever the maze",
    reads="reads the maze", seen="in SFT", published="published maze evaluation")

#: Answers verified per call of the batch verifier (rows of one maze's broadcast grid).
_CHUNK = 8192


def answer_distribution(task: maze_lib.MazeTask, split: str = "sft"
                        ) -> tuple[list[tuple[int, ...]], np.ndarray]:
    """(distinct answers as move tuples, their frequencies f_a summing to 1) among the
    shortest paths of `split`, most frequent first (ties in first-seen order)."""
    counts = Counter(tuple(int(t) for t in path) for path in task.solutions(split))
    if not counts:
        raise ValueError(f"split {split!r} has no mazes: the blind control needs its answers")
    answers, n = zip(*counts.most_common())
    freq = np.asarray(n, np.float64)
    return list(answers), freq / freq.sum()


def blind_success(walls: np.ndarray, answers: Sequence[Sequence[int]], freq: np.ndarray
                  ) -> np.ndarray:
    """q_m = sum_a f_a verify(m, a) for each maze of `walls` bool `[M, n, n]`: float64 `[M]`.

    Each answer is verified as the completion `moves + DONE` by the task's own verifier.
    """
    walls = np.asarray(walls, bool)
    freq = np.asarray(freq, np.float64)
    if len(answers) != freq.size:
        raise ValueError(f"{len(answers)} answers but {freq.size} frequencies")
    completions = [np.asarray([*a, maze_lib.DONE], np.int32) for a in answers]
    tokens, lengths = maze_lib.pad_completions(completions)
    q = np.zeros(walls.shape[0], np.float64)
    for m in range(walls.shape[0]):
        for lo in range(0, len(completions), _CHUNK):
            hi = lo + _CHUNK
            reward = maze_lib.walk(walls[m], tokens[lo:hi], lengths[lo:hi])["reward"]
            q[m] += float(np.dot(reward.astype(np.float64), freq[lo:hi]))
    return np.clip(q, 0.0, 1.0)


def task_validity(task: maze_lib.MazeTask, split: str, num_prompts: int,
                  ks: Sequence[int]) -> dict[str, Any]:
    """What a maze-blind guesser gets on the first `num_prompts` mazes of `split`:

    * `blind_pass_at_k` (exact, `base.blind_pass_at_k`) and the per-maze `blind_q`;
    * `distinct_answers` among those mazes and among the SFT answers;
    * `seen_in_sft`: the share of those mazes whose shortest path is also an SFT answer;
    * `median_moves`: the median length of their shortest paths.
    """
    answers, freq = answer_distribution(task, "sft")
    n = min(int(num_prompts), task.split_size(split))
    walls = task.walls(split, np.arange(n))
    q = blind_success(walls, answers, freq)
    paths = [tuple(int(t) for t in p) for p in task.solutions(split)[:n]]
    sft = set(answers)
    return {"split": split, "kind": "maze", "num_prompts": n, "size": task.size,
            "blind_pass_at_k": blind_pass_at_k(q, ks),
            "blind_q": q.tolist(),
            "distinct_answers": len(set(paths)), "distinct_sft_answers": len(answers),
            "seen_in_sft": float(np.mean([p in sft for p in paths])) if paths else 0.0,
            "median_moves": float(np.median([len(p) for p in paths])) if paths else 0.0}


def sft_width(task: maze_lib.MazeTask) -> int:
    """Static SFT row length: the prompt plus the longest answer the task can have."""
    return task.max_prompt_len + maze_lib.max_answer_length(task.size)


def latest_sft_step(sft_dir: str) -> int | None:
    """The step of the latest SFT checkpoint in `sft_dir` (None when there is none)."""
    with Checkpointer(os.path.join(sft_dir, "checkpoints")) as ckpt:
        return ckpt.latest_step()


def validate_maze(cfg: ml_collections.ConfigDict) -> None:
    """The maze task, policy and SFT blocks (StudyError naming the field)."""
    c = common.check
    t = cfg.task
    c(isinstance(t.size, int) and t.size >= 3 and t.size % 2 == 1, "task.size", t.size,
      "an odd integer >= 3")
    c(cfg.model.get("dtype", "float32") in DTYPE_NAMES, "model.dtype", cfg.model.get("dtype"),
      f"one of {DTYPE_NAMES} (the compute dtype; parameters stay float32)")
    for field in ("num_train", "num_eval"):
        c(common.positive_int(t[field]), f"task.{field}", t[field], "an integer >= 1")
    c(t.get("generator", "prim") in maze_lib.GENERATORS, "task.generator",
      t.get("generator"), f"one of {maze_lib.GENERATORS}")
    c(isinstance(t.num_sft, int) and t.num_sft >= 0, "task.num_sft", t.num_sft,
      "an integer >= 0")
    num_test, test_seed = t.get("num_test", 0), t.get("test_seed", None)
    c(isinstance(num_test, int) and not isinstance(num_test, bool) and num_test >= 0,
      "task.num_test", num_test, "an integer >= 0 (0 = no sealed test split)")
    if num_test > 0:
        c(isinstance(test_seed, int) and not isinstance(test_seed, bool)
          and test_seed != t.get("seed", 0), "task.test_seed", test_seed,
          f"an integer other than task.seed={t.get('seed', 0)} (the sealed split's own "
          f"stream; required with task.num_test={num_test})")
    c(common.positive_int(t.max_new_tokens) and
      t.max_new_tokens >= maze_lib.max_answer_length(t.size), "task.max_new_tokens",
      t.max_new_tokens, f">= the longest answer of a {t.size}x{t.size} maze "
      f"({maze_lib.max_answer_length(t.size)})")
    try:
        sft_lib.validate(cfg.sft)
    except ValueError as e:
        raise common.StudyError(str(e)) from None
    if cfg.sft.split == "sft":
        c(t.num_sft >= 1, "task.num_sft", t.num_sft, ">= 1 (the SFT split is trained on)")


@register
class MazeKind(Kind):
    """Mazes (`sera_jax.tasks.maze`, splits train / eval / sft) and a policy trained from
    scratch: the named preset `model.preset` with `model.overrides`, SFT on shortest paths."""

    name = "maze"
    words = WORDS

    def validate(self, cfg: ml_collections.ConfigDict) -> None:
        validate_maze(cfg)

    def build_task(self, cfg: ml_collections.ConfigDict) -> maze_lib.MazeTask:
        return maze_lib.task_from_config(cfg.task)

    def build_model(self, cfg: ml_collections.ConfigDict, mesh: jax.sharding.Mesh | None = None
                    ) -> Decoder:
        """A freshly initialised policy: `model.preset` with overrides, the compute dtype
        `model.dtype` (float32 parameters: the master weights of SFT/RL) and the layer layout
        `model.scan_layers` (stacked layers run by one scan)."""
        overrides = dict(cfg.model.get("overrides", {}) or {})
        overrides["dtype"] = dtype_from_name(cfg.model.get("dtype", "float32"), "model.dtype")
        overrides["scan_layers"] = bool(cfg.model.get("scan_layers", False))
        dcfg = get_model_config(cfg.model.preset, **overrides)
        if dcfg.vocab_size != maze_lib.VOCAB_SIZE:
            raise common.StudyError(f"config.model: vocab_size={dcfg.vocab_size}; the maze "
                                    f"vocabulary has {maze_lib.VOCAB_SIZE} ids")
        return Decoder(dcfg, rngs=nnx.Rngs(int(cfg.model.seed)))

    def eval_sampling(self, cfg: ml_collections.ConfigDict, task: Any) -> SamplingConfig:
        return SamplingConfig(max_new_tokens=task.max_new_tokens,
                              temperature=cfg.eval.temperature, stop_ids=tuple(task.stop_ids),
                              pad_id=task.pad_id,
                              cache_dtype=cfg.eval.get("kv_cache_dtype", "") or None)

    def start_fingerprint(self, cfg: ml_collections.ConfigDict) -> dict[str, Any]:
        """Task (its splits), model and SFT config."""
        # The SFT never reads the sealed test split (nor do the other splits depend on it).
        task = loop.trim_fields(cfg.task.to_dict(), TEST_FIELDS, defaults=TASK_DEFAULTS)
        return {"task": task,
                "model": loop.trim_fields(cfg.model.to_dict(), defaults=MODEL_DEFAULTS),
                "sft": sft_lib.config_fingerprint(cfg.sft)}

    def test_split(self, cfg: ml_collections.ConfigDict) -> dict[str, Any] | None:
        """`{"num_test", "test_seed"}` of `cfg.task` when `task.num_test` > 0, else None."""
        num_test = int(cfg.task.get("num_test", 0) or 0)
        return ({"num_test": num_test, "test_seed": int(cfg.task.test_seed)}
                if num_test > 0 else None)

    def train_start(self, cfg: ml_collections.ConfigDict, start_dir: str, mesh: Any,
                    workdir: str) -> tuple[Any, int]:
        """SFT (train, resume or skip) on the one loop; the SFT'd policy and its step."""
        task = self.build_task(cfg)
        program = sft_lib.SFTProgram(
            self.build_model(cfg), cfg.sft, lambda ids: task.sft_examples(cfg.sft.split, ids),
            task.split_size(cfg.sft.split), sft_width(task), task.pad_id, mesh=mesh)
        result = sft_lib.train(program, start_dir, fingerprint=self.start_fingerprint(cfg))
        if result.resumed_from != cfg.sft.num_steps:
            log_timing(workdir, "sft_train", result.seconds)
        return program.model, result.step

    def load_start(self, cfg: ml_collections.ConfigDict, start_dir: str, mesh: Any = None
                   ) -> tuple[Any, int]:
        """The final SFT checkpoint in `start_dir`."""
        model = self.build_model(cfg, mesh)
        step = sft_lib.load_final_params(model, cfg.sft, start_dir, mesh,
                                         fingerprint=self.start_fingerprint(cfg))
        return model, step

    def start_step(self, cfg: ml_collections.ConfigDict, start_dir: str) -> int | None:
        return latest_sft_step(start_dir)

    def blind_validity(self, task: Any, split: str, num_prompts: int, ks: Sequence[int]
                       ) -> dict[str, Any]:
        return task_validity(task, split, num_prompts, ks)

    def held_out_phrase(self, report: dict[str, Any]) -> str:
        n = report.get("num_prompts", report.get("num_mazes"))
        where = SPLIT_NAMES[report.get("split", "eval")]
        return f"{n} {where} {report['size']}x{report['size']} {self.words.prompts}"
