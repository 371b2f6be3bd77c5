"""A toy RL task and a tiny decoder shared by the trainer tests."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from flax import nnx

from sera_jax.models.decoder import Decoder, DecoderConfig
from sera_jax.tasks.base import RLTask

PAD, BOS, STOP = 0, 1, 2
VOCAB = 8


class EmitTask(RLTask):
    """Prompt i = [BOS, 3 + i % 4] (+ one BOS more for odd i, so prompt lengths differ).

    A completion is correct when its first token repeats the prompt's last token (a copy
    task; a random policy over the 8 tokens solves it with p ~ 1/8).
    """

    pad_id = PAD
    stop_ids = (STOP,)
    max_prompt_len = 3
    max_new_tokens = 3

    def __init__(self, sizes: dict[str, int] | None = None):
        self.sizes = sizes or {"train": 12, "eval": 4}

    def split_size(self, split: str) -> int:
        return self.sizes[split]

    def _target(self, i: int) -> int:
        return 3 + i % 4

    def prompt_tokens(self, split: str, ids: Sequence[int]) -> list[np.ndarray]:
        return [np.array([BOS] * (1 + i % 2) + [self._target(i)], np.int32) for i in ids]

    def score(self, split, ids, completions, truncated) -> np.ndarray:
        return np.array(
            [float(len(c) > 0 and c[0] == self._target(i)) for i, c in zip(ids, completions)],
            np.float32)

    def extract_answers(self, split, ids, completions):
        """Majority-vote key: the first generated token (None when empty)."""
        return [int(c[0]) if len(c) else None for c in completions]


def tiny_config(**changes) -> DecoderConfig:
    cfg = DecoderConfig(vocab_size=VOCAB, hidden_size=16, intermediate_size=32, num_layers=1,
                        num_heads=4, num_kv_heads=2, rope_theta=10_000.0)
    return cfg.replace(**changes) if changes else cfg


def tiny_model(seed: int = 0, **changes) -> Decoder:
    return Decoder(tiny_config(**changes), rngs=nnx.Rngs(seed))
