"""The `Kind` interface, the `Words` of a kind's reports and the registry `KINDS` (filled
by `@register`; `sera_jax.studies.paired.kinds` imports every kind)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import jax
import ml_collections
import numpy as np

from sera_jax.metrics import analytic_pass_at_k
from sera_jax.sampling import SamplingConfig

#: How the outputs name each split's prompts (`spec.SPLITS`).
SPLIT_NAMES = {"eval": "held-out", "train": "training", "test": "sealed test"}
#: The fields every blind-control report has (`Kind.blind_validity`).
BLIND_KEYS = ("split", "kind", "num_prompts", "blind_pass_at_k", "blind_q",
              "distinct_answers", "distinct_sft_answers", "seen_in_sft")


@dataclasses.dataclass(frozen=True)
class Words:
    """How the reports name a kind's things (tables, validity lines, figure labels)."""

    prompt: str  # one prompt: "maze", "problem"
    prompts: str  # plural
    start: str  # the start's row label: "SFT", "start"
    start_long: str  # "SFT start", "pretrained start"
    start_row: str  # the tables' start row, formatted with `step`: "SFT (start, step-{step} keys)"
    blind: str  # the blind guesser's adjective: "maze-blind", "answer-blind"
    blind_policy: str  # what the blind guesser does, as a noun phrase
    blind_note: str  # the same, short, for the JSON note
    reads: str  # what a valid start does: "reads the maze"
    seen: str  # where the blind guesser's answers come from: "in SFT"
    published: str  # the with-replacement bootstrap's provenance


class Kind:
    """One task kind (module docstring). Subclasses set `name` and `words` and implement the
    methods; `name` is also the results folder `results/<name>/<config.name>/`."""

    name: str = ""
    words: Words
    #: The binary that runs this kind's studies (named in error messages).
    binary: str = "experiments.maze"

    def validate(self, cfg: ml_collections.ConfigDict) -> None:
        """The task, model and start blocks (StudyError naming the field)."""
        raise NotImplementedError

    def build_task(self, cfg: ml_collections.ConfigDict) -> Any:
        raise NotImplementedError

    def build_model(self, cfg: ml_collections.ConfigDict, mesh: jax.sharding.Mesh | None = None
                    ) -> Any:
        raise NotImplementedError

    def eval_sampling(self, cfg: ml_collections.ConfigDict, task: Any) -> SamplingConfig:
        raise NotImplementedError

    def start_fingerprint(self, cfg: ml_collections.ConfigDict) -> dict[str, Any]:
        """What defines the start (its task splits, model and training)."""
        raise NotImplementedError

    def test_split(self, cfg: ml_collections.ConfigDict) -> dict[str, Any] | None:
        """The fields that define the sealed 'test' split of `cfg`'s task, `{"num_test": n,
        ...}` with n >= 1, or None when it has none (the default: a kind without one)."""
        del cfg
        return None

    def train_start(self, cfg: ml_collections.ConfigDict, start_dir: str, mesh: Any,
                    workdir: str) -> tuple[Any, int]:
        """Make the start in `start_dir` (or resume / skip it): (policy or None, its step)."""
        raise NotImplementedError

    def load_start(self, cfg: ml_collections.ConfigDict, start_dir: str, mesh: Any = None
                   ) -> tuple[Any, int]:
        """(the policy RL starts from, its step)."""
        raise NotImplementedError

    def start_step(self, cfg: ml_collections.ConfigDict, start_dir: str) -> int | None:
        """The start's step (None when it is not made yet)."""
        raise NotImplementedError

    def blind_validity(self, task: Any, split: str, num_prompts: int, ks: Sequence[int]
                       ) -> dict[str, Any]:
        """The blind control on the first `num_prompts` prompts of `split` (`BLIND_KEYS`)."""
        raise NotImplementedError

    def held_out_phrase(self, report: dict[str, Any]) -> str:
        """The validity line's description of the prompts of a blind report (held-out, or
        the split it names)."""
        n = report.get("num_prompts", report.get("num_mazes"))
        return f"{n} {SPLIT_NAMES[report.get('split', 'eval')]} {self.words.prompts}"


def blind_pass_at_k(q: np.ndarray, ks: Sequence[int]) -> dict[str, float]:
    """Mean over prompts of a blind policy's exact pass@k, `1 - (1 - q_m)^k` with `q_m` its
    success probability on prompt m, keyed like the study's pass@k records (`str(k)`)."""
    q = np.asarray(q, np.float64)
    return {str(int(k)): float(np.mean(analytic_pass_at_k(q, int(k)))) for k in ks}


KINDS: dict[str, Kind] = {}


def register(cls: type[Kind]) -> type[Kind]:
    """Class decorator: add an instance of `cls` to `KINDS` under `cls.name`."""
    if not cls.name or cls.name in KINDS:
        raise ValueError(f"kind {cls.name!r}: a kind needs a new, non-empty name")
    KINDS[cls.name] = cls()
    return cls

