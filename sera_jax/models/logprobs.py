"""Per-token log-probabilities of a `Decoder` forward.

`token_logprobs`: out[b, t] = log p(tokens[b, t] | tokens[b, :t]) from one full forward.
`shared_prefix_logprobs`: the same for completions of rows that share prompts, each
prompt's forward computed once (a KV cache gathered to its rows).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from sera_jax.models.decoder import Decoder, KVCache, init_cache, positions_from_mask


def token_logprobs(
    model: Decoder,
    tokens: jax.Array,
    attention_mask: jax.Array,
    positions: jax.Array | None = None,
    start: int = 0,
    temperature: float = 1.0,
) -> jax.Array:
    """Per-token log-likelihood aligned with `tokens`.

    out[b, t] = log p(tokens[b, t] | tokens[b, :t]), from one full forward (no cache);
    `temperature` (a static float > 0): log-probabilities of the tempered policy
    softmax(logits / temperature), the distribution a sampler at that temperature without
    top-p / top-k draws from (1.0: the model's own);
    out[:, 0] = 0 (nothing predicts the first token) and positions where `attention_mask`
    is False are 0. Positions default to `positions_from_mask(attention_mask)` (left
    padding). Returns float32 [B, T].

    `start` (a static int, 0 <= start <= T): return only `out[:, start:]` ([B, T - start]);
    the vocabulary head and its log-sum-exp then run only at the T - start positions that
    predict those tokens (a trainer needs the completion's log-probs, not the prompt's).
    """
    b, t = tokens.shape
    if not 0 <= start <= t:
        raise ValueError(f"token_logprobs: start={start} must be in [0, T={t}]")
    if positions is None:
        positions = positions_from_mask(attention_mask)
    first = max(start, 1)  # the first predicted token
    if first >= t:
        return jnp.zeros((b, t - start), jnp.float32)
    logits, _ = model(tokens, positions, attention_mask=attention_mask,
                      logits_from=first - 1)
    logits = logits[:, :-1]  # [B, T - first, V]: predictions of tokens[:, first:]
    if temperature != 1.0:
        logits = logits / temperature
    targets = tokens[:, first:]
    picked = jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]
    lp = picked - jax.nn.logsumexp(logits, axis=-1)
    lp = jnp.where(attention_mask[:, first:], lp, 0.0)
    if start == 0:  # nothing predicts token 0
        lp = jnp.concatenate([jnp.zeros_like(lp[:, :1]), lp], axis=1)
    return lp


def shared_prefix_logprobs(
    model: Decoder,
    prefix_tokens: jax.Array,
    prefix_mask: jax.Array,
    row_prefix: jax.Array,
    completion_tokens: jax.Array,
    completion_mask: jax.Array,
) -> jax.Array:
    """Completion log-probs of rows that share prompts, each prompt's forward computed once.

    Row r continues prompt `row_prefix[r]` of the S left-padded prompts `prefix_tokens` /
    `prefix_mask` [S, W]. Returns float32 [R, T] equal (up to float summation order) to
    `token_logprobs(model, concat(prefix[row_prefix], completion), mask, start=W)`:
    out[r, t] = log p(completion[r, t] | prompt, completion[r, :t]), 0 where
    `completion_mask` is False.

    How: one forward over the S prompts fills a W-slot KV cache and gives each prompt's
    last-position logits (the prediction of completion token 0); the cache rows are
    gathered to the R rows and the first T - 1 completion tokens run as one cached block
    (queries attend to the prompt's slots and causally to each other), whose logits
    predict tokens 1..T-1. Gradients reach the prompt forward through the gather (summed
    over the rows of a prompt). A training batch of R rows over S << R prompts then runs
    S·W + R·T tokens through the network instead of R·(W + T). Memory: the block's
    attention scores are one [R, H, T - 1, W + T - 1] float32 array (not query-blocked).
    """
    s, w = prefix_tokens.shape
    r, t = completion_tokens.shape
    cfg = model.cfg
    prefix_mask = prefix_mask.astype(bool)
    completion_mask = completion_mask.astype(bool)
    cache = init_cache(cfg, s, w, dtype=cfg.dtype)
    # `last_only` (the last layer's attention output and MLP for the last token alone) is
    # an inference path under `scan_layers` (it indexes the stacked weights per layer, which
    # a backward pass would turn into L full-size gradient updates): scanned models run
    # every query and take the head at the last position.
    scan = cfg.scan_layers
    last_logits, cache = model(prefix_tokens, positions_from_mask(prefix_mask), cache=cache,
                               attention_mask=prefix_mask, last_only=not scan,
                               logits_from=w - 1 if scan else 0)
    logits = jnp.take(last_logits[:, 0], row_prefix, axis=0)[:, None]  # [R, 1, V]
    if t > 1:
        # RoPE positions continue each prompt's real tokens, exactly as
        # `positions_from_mask` numbers the concatenated row.
        start = jnp.sum(prefix_mask, axis=1, dtype=jnp.int32)[row_prefix]
        positions = jnp.maximum(
            start[:, None] + jnp.cumsum(completion_mask.astype(jnp.int32), axis=1) - 1, 0)
        grow = t - 1  # slots for the completion block (its last token predicts nothing)

        def rows(x, slot_axis):
            x = jnp.take(x, row_prefix, axis=0)
            pad = [(0, 0)] * x.ndim
            pad[slot_axis] = (0, grow)
            return jnp.pad(x, pad)

        rows_cache = KVCache(
            k=jax.tree.map(lambda x: rows(x, x.ndim - 1), cache.k),
            v=jax.tree.map(lambda x: rows(x, x.ndim - 2), cache.v),
            valid=rows(cache.valid, 1), index=jnp.asarray(w, jnp.int32))
        block_logits, _ = model(completion_tokens[:, :-1], positions[:, :-1],
                                cache=rows_cache, attention_mask=completion_mask[:, :-1])
        logits = jnp.concatenate([logits, block_logits], axis=1)  # [R, T, V]
    picked = jnp.take_along_axis(logits, completion_tokens[..., None], axis=-1)[..., 0]
    lp = picked - jax.nn.logsumexp(logits, axis=-1)
    return jnp.where(completion_mask, lp, 0.0)
