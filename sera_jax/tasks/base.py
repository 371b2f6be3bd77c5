"""The contract between an RL task (maze, math, ...) and the trainer.

A task owns prompts with stable integer ids per split, their tokenisation, and a binary
verifier. Everything here runs on the host (NumPy / Python): verifiers parse text or walk
grids, which is not array math. The trainer never looks inside a task beyond this API.
"""

from __future__ import annotations

import abc
from collections.abc import Hashable, Sequence

import numpy as np


class RLTask(abc.ABC):
    """Prompts + binary verifier. Prompt ids are `0..split_size(split)-1` and stable.

    Stability matters: the success-history tracker keys its Beta posterior on these ids,
    so an id must name the same prompt in every epoch, process and resumed run.
    """

    #: Token id used to pad prompts (left) and completions (right).
    pad_id: int
    #: Generation stops after any of these tokens (the stop token is kept in the output).
    stop_ids: tuple[int, ...]
    #: Longest prompt over all splits, in tokens (the sampler's static prompt width).
    max_prompt_len: int
    #: Largest completion length; a completion that reaches it without a stop is truncated.
    max_new_tokens: int

    @abc.abstractmethod
    def split_size(self, split: str) -> int:
        """Number of prompts in `split` ('train', 'eval', ...)."""

    @abc.abstractmethod
    def prompt_tokens(self, split: str, ids: Sequence[int]) -> list[np.ndarray]:
        """Token ids (int32, unpadded) of each prompt in `ids`."""

    @abc.abstractmethod
    def score(
        self,
        split: str,
        ids: Sequence[int],
        completions: Sequence[np.ndarray],
        truncated: np.ndarray,
    ) -> np.ndarray:
        """Binary rewards (float32 in {0, 1}) for completions of prompts `ids`.

        `completions[i]` holds the generated tokens of row i up to and including its stop
        token (no padding). `truncated[i]` is True when row i hit `max_new_tokens` without
        a stop token. Must be total: any token sequence gets 0 or 1, never an exception.
        """

    def extract_answers(
        self, split: str, ids: Sequence[int], completions: Sequence[np.ndarray]
    ) -> list[Hashable | None] | None:
        """Optional majority-vote hook: a hashable final answer per completion (None when a
        completion has no answer), such that completions with equal answers get equal
        scores. Return None (the default) when the task has no notion of an answer; then
        `sera_jax.rl.evaluate` skips majority voting.
        """
        del split, ids, completions
        return None

    def decode(self, tokens: Sequence[int]) -> str:
        """Human-readable text of a token sequence (for logs and notebooks)."""
        return " ".join(str(int(t)) for t in tokens)
