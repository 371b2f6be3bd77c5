"""Sampling-based evaluation: n samples per prompt -> unbiased pass@k and majority vote.

`evaluate(model, task, split, num_samples=n, ...)` samples n completions of every prompt
(rows flattened as prompt-major `[prompt, sample]`, generated `batch_size` rows per sampler
call so memory is bounded, last chunk padded to the same static shape), scores them with
the task verifier and reports, for k = 1, 2, 4, ... up to n (and n itself), the mean over
prompts of the unbiased estimator `pass@k = 1 - C(n-c, k)/C(n, k)`
(`sera_jax.metrics.pass_at_k_curve`). When the task implements
`RLTask.extract_answers`, `maj@n` is the fraction of prompts whose most frequent answer
(ties: the answer seen first) is correct.

Sample r of prompt id q uses the key `fold_in(key, q * n + r)`: results do not depend on
`batch_size`, on which other prompts are evaluated, or on the mesh.
"""

from __future__ import annotations

import collections
import csv
import dataclasses
import os
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh

from sera_jax import sharding as shd
from sera_jax.metrics import pass_at_k_curve
from sera_jax.sampling import SamplingConfig, generate_rows, left_pad
from sera_jax.tasks.base import RLTask


@dataclasses.dataclass
class EvalResult:
    """Per-prompt counts and the summary of one evaluation.

    prompt_ids, num_correct, majority_correct (NaN when the task has no answers): [P].
    outcomes: [P, n] int8 `OUTCOMES` index of every sample (correct, wrong answer, no answer,
    truncated); lengths: [P, n] its generated tokens.
    summary: {'pass@k': ..., 'maj@n' (when available), 'reward_mean', 'mean_length',
    'truncated_fraction', 'num_prompts', 'num_samples'}.
    """

    prompt_ids: np.ndarray
    num_samples: int
    num_correct: np.ndarray
    majority_correct: np.ndarray
    summary: dict[str, float]
    outcomes: np.ndarray | None = None
    lengths: np.ndarray | None = None

    def to_dict(self) -> dict[str, float]:
        """The summary scalars (for TensorBoard / JSON)."""
        return dict(self.summary)

    def write_csv(self, directory: str | os.PathLike, prefix: str = "eval") -> tuple[str, str]:
        """Write `<prefix>_summary.csv` (metric,value) and `<prefix>_prompts.csv`
        (prompt_id,num_samples,num_correct,majority_correct); returns both paths."""
        os.makedirs(directory, exist_ok=True)
        summary_path = os.path.join(directory, f"{prefix}_summary.csv")
        prompts_path = os.path.join(directory, f"{prefix}_prompts.csv")
        with open(summary_path, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["metric", "value"])
            w.writerows(self.summary.items())
        with open(prompts_path, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["prompt_id", "num_samples", "num_correct", "majority_correct"])
            for q, c, m in zip(self.prompt_ids, self.num_correct, self.majority_correct):
                w.writerow([int(q), self.num_samples, int(c), "" if np.isnan(m) else int(m)])
        return summary_path, prompts_path


#: A sample's outcome class, by index: rewarded; an answer that is wrong; no answer the task
#: can read (only for tasks with `extract_answers`); cut by the length cap (truncated samples
#: score 0, whatever they say).
OUTCOMES = ("correct", "wrong", "no_answer", "truncated")


def outcome_classes(rewards: np.ndarray, truncated: np.ndarray,
                    answers: Sequence[Any] | None) -> np.ndarray:
    """Each sample's `OUTCOMES` index (int8): truncated first, then correct (reward > 0),
    then no answer (`answers[i] is None`; never when `answers` is None), else wrong."""
    truncated = np.asarray(truncated, bool)
    none = (np.zeros(truncated.shape, bool) if answers is None
            else np.array([a is None for a in answers], bool))
    return np.select([truncated, np.asarray(rewards) > 0, none], [3, 0, 2], 1).astype(np.int8)


def prompt_slots(num_prompts: int, width: int, num_samples: int) -> int:
    """Prompt slots of every `generate_rows` call of `evaluate`: the most distinct prompts
    `width` consecutive prompt-major rows (`num_samples` per prompt) can hold,
    min(P, (width - 1) // n + 2), so every chunk, the last one included, has one shape (one
    compiled sampler)."""
    return min(int(num_prompts), (int(width) - 1) // int(num_samples) + 2)


def majority_vote(answers: Sequence[Any], rewards: np.ndarray) -> float:
    """1.0 when the most frequent non-None answer (ties: first seen) was scored correct,
    0.0 when it was not or when no sample has an answer."""
    counts = collections.Counter(a for a in answers if a is not None)
    if not counts:
        return 0.0
    best = max(counts.values())
    winner = next(a for a in answers if a is not None and counts[a] == best)
    return float(rewards[next(i for i, a in enumerate(answers) if a == winner)])


def sample_rows(model: Any, prompts: np.ndarray, prompt_mask: np.ndarray, prompt_ids: np.ndarray,
                num_samples: int, sampling: SamplingConfig, key: jax.Array, batch_size: int,
                mesh: Mesh | None = None) -> tuple[np.ndarray, Any]:
    """`num_samples` completions of each left-padded prompt row ([P, W]) as flat rows,
    prompt-major (row j is sample j % n of prompt j // n): `(row_prompt, generate_rows
    output)`. Sample r of prompt id q uses `fold_in(key, q·n + r)`, independent of the
    batching and of the other prompts, so every policy scored with `key` sees the same
    random numbers (common random numbers)."""
    ids, n = np.asarray(prompt_ids, np.int64), int(num_samples)
    row_prompt = np.repeat(np.arange(ids.size), n)
    row_key_index = ids[row_prompt] * n + np.tile(np.arange(n), ids.size)
    width = shd.round_up_to_shards(min(int(batch_size), row_prompt.size), mesh)
    keys = jax.vmap(lambda i: jax.random.fold_in(key, i))(
        jnp.asarray(row_key_index % (2**32), jnp.uint32))
    return row_prompt, generate_rows(model, prompts, prompt_mask, row_prompt, keys, sampling,
                                     rows_per_call=width, mesh=mesh,
                                     prompt_slots=prompt_slots(ids.size, width, n))


def evaluate(
    model: nnx.Module,
    task: RLTask,
    split: str,
    *,
    num_samples: int,
    sampling: SamplingConfig,
    key: jax.Array,
    prompt_ids: Sequence[int] | None = None,
    batch_size: int = 256,
    mesh: Mesh | None = None,
) -> EvalResult:
    """Sample `num_samples` completions per prompt of `split` and compute pass@k / maj@n.

    `sampling` fixes temperature / top-p / top-k / length (its `stop_ids` and `pad_id`
    should be the task's); `prompt_ids` defaults to the whole split; `batch_size` rows go
    through the sampler per call (a multiple of the mesh's batch shards when `mesh` is
    given, in which case rows are sharded over it and `model` should live on it).
    """
    if num_samples < 1:
        raise ValueError(f"num_samples={num_samples}; must be >= 1")
    if batch_size < 1:
        raise ValueError(f"batch_size={batch_size}; must be >= 1")
    if mesh is not None and batch_size % shd.batch_divisor(mesh):
        raise ValueError(f"batch_size={batch_size} is not a multiple of the "
                         f"{shd.batch_divisor(mesh)} batch shards of mesh {dict(mesh.shape)}")
    ids = np.arange(task.split_size(split)) if prompt_ids is None else np.asarray(prompt_ids)
    if ids.size == 0:
        raise ValueError("prompt_ids is empty; nothing to evaluate")
    prompts, pmask = left_pad(task.prompt_tokens(split, ids.tolist()), int(task.max_prompt_len),
                              int(task.pad_id))
    n = int(num_samples)
    total = ids.size * n
    row_prompt, out = sample_rows(model, prompts, pmask, ids, n, sampling, key, batch_size, mesh)
    tokens, lengths, truncated = out.tokens, out.lengths, out.truncated

    completions = [tokens[j, : lengths[j]] for j in range(total)]
    row_ids = ids[row_prompt].tolist()
    rewards = np.asarray(task.score(split, row_ids, completions, truncated), np.float64)
    correct = rewards.reshape(ids.size, n).sum(axis=1).astype(np.int64)
    ks, values = pass_at_k_curve(np.full(ids.size, n), correct)
    summary = {f"pass@{int(k)}": float(v) for k, v in zip(ks, values)}

    answers = task.extract_answers(split, row_ids, completions)
    majority = np.full(ids.size, np.nan)
    if answers is not None:
        rr = rewards.reshape(ids.size, n)
        majority = np.array([majority_vote(answers[q * n:(q + 1) * n], rr[q])
                             for q in range(ids.size)])
        summary[f"maj@{n}"] = float(majority.mean())
    summary.update(reward_mean=float(rewards.mean()), mean_length=float(lengths.mean()),
                   truncated_fraction=float(truncated.mean()), num_prompts=float(ids.size),
                   num_samples=float(n))
    return EvalResult(prompt_ids=ids, num_samples=n, num_correct=correct,
                      majority_correct=majority, summary=summary,
                      outcomes=outcome_classes(rewards, truncated, answers).reshape(ids.size, n),
                      lengths=np.asarray(lengths, np.int32).reshape(ids.size, n))
