"""Autoregressive sampling: jit prefill + `lax.while_loop` decode over a fixed-size KV cache.

One compiled program per (model graph, batch, prompt width, `SamplingConfig`): the prompts
are prefilled over a prompt-sized cache (a few rows per `lax.map` step, so a chunk's
activations stay in a CPU's cache), then each loop iteration feeds one token per row and
samples the next. Shapes never change inside a loop, rows that emitted a stop token keep
running on pad tokens (masked out of the cache) and decoding exits early once every row is
done. Decoding runs in up to `_MAX_DECODE_PHASES` phases (`decode_phase_ends`), each a
`while_loop` over a cache holding exactly the slots its steps can reach, copied into the
next, larger one at the boundary: a decode step is memory-bound on streaming the cache, so
early steps read less of it (the price: during the last copy the previous phase's cache
and the full one coexist, up to 1.75x the cache memory). For the flat RL rollout batch
(prompt q repeated N_q times) pass the P distinct prompts plus `segment_ids`: each prompt
is prefilled once, not N_q times.

Padding. Prompts are *left*-padded (`left_pad`), positions are
`cumsum(mask) - 1` and pad slots are invalid in the cache, so a row's computation does not
depend on how much padding it got: a batch of prompts of different lengths yields the same
tokens as sampling each prompt alone. Randomness is per row: row r draws step t from
`fold_in(row_keys[r], t)`, where by default `row_keys[r] = fold_in(key, r)`; pass explicit
`row_keys` to make a row's sample independent of its position in the batch.

Log-probabilities. `SampleOutput.logprobs` is `log pi(y_t | x, y_<t)` under the model's
*temperature-1, unfiltered* policy -- the policy an on-policy trainer differentiates (the
importance ratio of MaxRL/GRPO is computed against it). `SampleOutput.sampling_logprobs` is
the log-probability under the distribution actually sampled from (temperature, top-k,
top-p applied; 0 for greedy). The two agree when temperature == 1 and no filter is on.

Sharding. Nothing here names a device: pass params and prompts that carry `NamedSharding`s
and the jitted program is partitioned by XLA's propagation (batch-sharded prompts give a
batch-sharded cache).
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Sequence

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh

from sera_jax import sharding as shd
from sera_jax.estimators import segment_ids_from_counts
from sera_jax.models.attention import map_row_chunks
from sera_jax.models.configs import DTYPE_NAMES
from sera_jax.models.decoder import KVCache, init_cache, positions_from_mask
from sera_jax.sampling_draw import first_argmax, gumbel_max, inverse_cdf, token_logprob

# Weight of a filtered-out token: -inf gives exact zeros in softmax / categorical.
_NEG_INF = -jnp.inf
#: Prompt tokens per batch shard in one prefill chunk: the prompts are prefilled a few rows
#: at a time so a chunk's activations stay in a CPU's cache between layers.
_PREFILL_CHUNK_TOKENS = 2048
#: Decode steps per phase: phase i attends to the cache slots it can reach only.
_DECODE_PHASE_STEPS = 48
#: `SamplingConfig.token_draw` values.
TOKEN_DRAWS = ("fast", "reference", "inverse_cdf")
#: At most this many phases (each one is another compiled copy of the decode step).
_MAX_DECODE_PHASES = 4


@dataclasses.dataclass(frozen=True)
class SamplingConfig:
    """How to turn next-token logits into tokens (hashable: a static argument of jit).

    Attributes:
      max_new_tokens: completion length budget (>= 1); a row that reaches it without a stop
        token is `truncated`.
      temperature: logits are divided by it before filtering/sampling (> 0; ignored when
        `greedy`).
      top_p: nucleus mass in (0, 1]: keep the smallest set of most likely tokens whose
        probability (after temperature and top-k) reaches `top_p`; 1.0 disables.
      top_k: keep the `top_k` most likely tokens (ties at the boundary are all kept);
        0 disables.
      greedy: argmax decoding (temperature / top-k / top-p ignored).
      stop_ids: generation of a row ends after any of these tokens (which is kept).
      pad_id: written after a row's stop token.
      cache_dtype: dtype name of the KV cache ("float32" | "bfloat16"); None = the model's
        compute dtype (`init_cache`'s default), or the dtype of the cache passed to
        `generate_with_cache`. A bfloat16 cache halves the cache memory a decode step
        streams; attention still runs in the model's compute dtype.
      token_draw: "fast" (`sera_jax.sampling_draw`: fewer full-vocabulary passes) or
        "reference" (`jax.random.categorical` / `jnp.argmax` / `log_softmax`, the code
        before it, kept as the benchmarks' baseline). Both give the same tokens for the
        same keys and the same log-probs up to float rounding. "inverse_cdf"
        (`sampling_draw.inverse_cdf`): the same distribution from one uniform per row
        instead of a [V] Gumbel noise vector, so other tokens for the same key (greedy: as
        "fast").
    """

    max_new_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    greedy: bool = False
    stop_ids: tuple[int, ...] = ()
    pad_id: int = 0
    cache_dtype: str | None = None
    token_draw: str = "fast"

    def __post_init__(self):
        if int(self.max_new_tokens) < 1:
            raise ValueError(f"max_new_tokens={self.max_new_tokens} must be >= 1")
        if not self.greedy and not float(self.temperature) > 0.0:
            raise ValueError(
                f"temperature={self.temperature} must be > 0 (use greedy=True for argmax)"
            )
        if not 0.0 < float(self.top_p) <= 1.0:
            raise ValueError(f"top_p={self.top_p} must be in (0, 1] (1.0 disables it)")
        if int(self.top_k) < 0:
            raise ValueError(f"top_k={self.top_k} must be >= 0 (0 disables it)")
        if self.cache_dtype is not None and self.cache_dtype not in DTYPE_NAMES:
            raise ValueError(f"cache_dtype={self.cache_dtype!r} must be None or one of "
                             f"{DTYPE_NAMES}")
        if self.token_draw not in TOKEN_DRAWS:
            raise ValueError(f"token_draw={self.token_draw!r} must be one of {TOKEN_DRAWS}")
        # Normalise so equal configs hash equal (a list or numpy ints would break jit caching).
        object.__setattr__(self, "stop_ids", tuple(int(s) for s in self.stop_ids))

    def validate_vocab(self, vocab_size: int) -> None:
        """Raise ValueError when a token id or `top_k` does not fit a vocabulary of this size."""
        for name, ids in (("stop_ids", self.stop_ids), ("pad_id", (self.pad_id,))):
            bad = [i for i in ids if not 0 <= i < vocab_size]
            if bad:
                raise ValueError(f"{name} contains {bad}, outside [0, {vocab_size})")
        if self.top_k > vocab_size:
            raise ValueError(f"top_k={self.top_k} exceeds the vocabulary size {vocab_size}")


@flax.struct.dataclass
class SampleOutput:
    """Completions of a batch (a pytree; every field has leading batch dimension B).

    tokens: int32 [B, max_new_tokens], `pad_id` after the stop token.
    logprobs: float32 [B, max_new_tokens], log pi(token) at temperature 1, unfiltered;
      0 after the stop token.
    sampling_logprobs: float32 [B, max_new_tokens], log-prob under the sampling distribution
      actually used (temperature/top-k/top-p; 0 for greedy); 0 after the stop token.
    lengths: int32 [B], generated tokens including the stop token.
    truncated: bool [B], True when the row hit `max_new_tokens` without a stop token.
    """

    tokens: jax.Array
    logprobs: jax.Array
    sampling_logprobs: jax.Array
    lengths: jax.Array
    truncated: jax.Array

    @property
    def mask(self) -> jax.Array:
        """bool [B, max_new_tokens]: True on generated tokens (stop token included)."""
        return jnp.arange(self.tokens.shape[1])[None, :] < self.lengths[:, None]


def filter_logits(logits: jax.Array, config: SamplingConfig) -> jax.Array:
    """Logits of the sampling distribution: `logits / T`, then top-k, then top-p masking.

    Removed tokens get -inf, so `softmax` of the result is the renormalised distribution
    that `generate` samples from. Order and semantics follow the common convention
    (Hugging Face `generate`): temperature, top-k (keep logits >= the k-th largest), top-p
    (keep a token when the mass of strictly more likely tokens is < top_p; the most likely
    token is always kept). Works on any leading shape `[..., V]`.
    """
    logits = logits.astype(jnp.float32) / jnp.float32(config.temperature)
    vocab = logits.shape[-1]
    k = config.top_k if 0 < config.top_k < vocab else 0
    if k == 0 and config.top_p >= 1.0:
        return logits
    if k == 0 and vocab > TOP_P_PREFIX:
        # Top-p alone would sort the whole vocabulary every step (49k for SmolLM2). The nucleus
        # almost always lies in the top TOP_P_PREFIX tokens: use them when they hold at least
        # top_p of the mass in every row (the result is then the same), else sort it all.
        prefix, _ = jax.lax.top_k(logits, TOP_P_PREFIX)
        log_z = jax.nn.logsumexp(logits, axis=-1, keepdims=True)
        covered = jnp.all(jnp.sum(jnp.exp(prefix - log_z), axis=-1) >= config.top_p)
        threshold = jax.lax.cond(
            covered,
            lambda: _top_p_threshold(prefix, log_z, config.top_p),
            lambda: _top_p_threshold(jax.lax.top_k(logits, vocab)[0], log_z, config.top_p))
        return jnp.where(logits < threshold, _NEG_INF, logits)
    top_vals, _ = jax.lax.top_k(logits, k if k else vocab)
    threshold = top_vals[..., -1:]
    if config.top_p < 1.0:
        # Renormalised over the top-k survivors (all of the vocabulary when k == 0).
        log_z = jax.nn.logsumexp(top_vals, axis=-1, keepdims=True)
        threshold = _top_p_threshold(top_vals, log_z, config.top_p)
    return jnp.where(logits < threshold, _NEG_INF, logits)


#: Candidates examined before falling back to a full sort for top-p without top-k.
TOP_P_PREFIX = 1024


def _top_p_threshold(sorted_vals: jax.Array, log_z: jax.Array, top_p: float) -> jax.Array:
    """Smallest kept logit: keep a token while the mass of strictly more likely ones < top_p.

    `sorted_vals` are the largest logits in descending order (a prefix of them is enough when
    it holds top_p of the mass); `log_z` is the log normaliser of the distribution.
    """
    probs = jnp.exp(sorted_vals - log_z)
    mass_before = jnp.cumsum(probs, axis=-1) - probs
    num_kept = jnp.sum(mass_before < top_p, axis=-1, keepdims=True)  # >= 1
    return jnp.take_along_axis(sorted_vals, num_kept - 1, axis=-1)


def sample_tokens(
    logits: jax.Array, keys: jax.Array | None, config: SamplingConfig
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Draw one token per row from `[B, V]` logits.

    `keys` holds one PRNG key per row (unused when greedy), so row r's draw depends only on
    `keys[r]` and `logits[r]`. Returns `(tokens int32[B], logprobs, sampling_logprobs)`:
    `logprobs = log_softmax(logits)[token]` (temperature 1, unfiltered) and
    `sampling_logprobs = log_softmax(filter_logits(logits))[token]` (0 for greedy).
    The token is `jax.random.categorical(keys[r], filter_logits(logits)[r])` (argmax when
    greedy) with `config.token_draw` "reference" or "fast" ("fast" evaluates it with fewer
    passes over the vocabulary, `sera_jax.sampling_draw`); "inverse_cdf" draws from the
    same distribution with other random numbers.
    """
    logits = logits.astype(jnp.float32)
    if config.token_draw == "reference":
        return _sample_tokens_reference(logits, keys, config)
    if config.greedy:
        tokens = first_argmax(logits)
        return tokens, token_logprob(logits, tokens), jnp.zeros(tokens.shape, jnp.float32)
    plain = (config.temperature == 1.0 and config.top_p >= 1.0
             and not 0 < config.top_k < logits.shape[-1])
    # Plain sampling draws from the logits themselves (filter_logits would return
    # `logits / 1.0`, the same values): one log-prob serves both outputs.
    filtered = logits if plain else filter_logits(logits, config)
    draw = inverse_cdf if config.token_draw == "inverse_cdf" else gumbel_max
    tokens = draw(keys, filtered)
    logprobs = token_logprob(logits, tokens)
    return tokens, logprobs, logprobs if plain else token_logprob(filtered, tokens)


def _sample_tokens_reference(logits, keys, config):
    """`sample_tokens` before `sampling_draw` (`token_draw="reference"`): the baseline."""
    if config.greedy:
        tokens = jnp.argmax(logits, axis=-1).astype(jnp.int32)
        sampling_logprobs = jnp.zeros(tokens.shape, jnp.float32)
    else:
        filtered = filter_logits(logits, config)
        tokens = jax.vmap(jax.random.categorical)(keys, filtered).astype(jnp.int32)
        sampling_logprobs = _gather(jax.nn.log_softmax(filtered, axis=-1), tokens)
    logprobs = _gather(jax.nn.log_softmax(logits, axis=-1), tokens)
    return tokens, logprobs, sampling_logprobs


def _gather(values: jax.Array, index: jax.Array) -> jax.Array:
    return jnp.take_along_axis(values, index[:, None], axis=-1)[:, 0]


def cache_length(prompt_width: int, config: SamplingConfig) -> int:
    """KV-cache slots `generate` needs: the prompt plus every fed-back completion token.

    The last sampled token is never fed back, hence `- 1`.
    """
    return prompt_width + config.max_new_tokens - 1


def decode_phase_ends(steps: int) -> list[int]:
    """End steps (exclusive) of the decode phases of a `max_new_tokens = steps` sample.

    The loop samples tokens 1 .. steps - 1 in `(steps - 1) // _DECODE_PHASE_STEPS` equal
    phases (at least 1, at most `_MAX_DECODE_PHASES`); a phase reads only the cache slots its
    last step can attend, so early steps stream less of the cache, on which a decode step is
    memory-bound (3 phases of 180 tokens after a 310-token prompt read 12% fewer cache
    bytes; 4 phases of a 1,024-token completion after a 100-token prompt about a third fewer;
    both computed from the shapes).
    """
    if steps <= 1:
        return []
    phases = min(_MAX_DECODE_PHASES, max(1, (steps - 1) // _DECODE_PHASE_STEPS))
    return [1 + round(i * (steps - 1) / phases) for i in range(1, phases + 1)]


def left_pad(
    sequences: Sequence[np.ndarray], width: int, pad_id: int
) -> tuple[np.ndarray, np.ndarray]:
    """Stack ragged token sequences into `[B, width]` left-padded tokens and a validity mask.

    Raises ValueError when a sequence is longer than `width`.
    """
    batch = len(sequences)
    tokens = np.full((batch, width), pad_id, dtype=np.int32)
    mask = np.zeros((batch, width), dtype=bool)
    for row, seq in enumerate(sequences):
        n = len(seq)
        if n > width:
            raise ValueError(f"sequence {row} has {n} tokens, more than the width {width}")
        if n:
            tokens[row, width - n :] = seq
            mask[row, width - n :] = True
    return tokens, mask


def default_row_keys(key: jax.Array, batch: int) -> jax.Array:
    """Per-row keys `fold_in(key, r)` for r in [0, batch): row r's stream depends on r only."""
    return jax.vmap(lambda r: jax.random.fold_in(key, r))(jnp.arange(batch, dtype=jnp.uint32))


def generate(
    model: nnx.Module,
    prompt_tokens: jax.Array,
    prompt_mask: jax.Array,
    key: jax.Array | None,
    config: SamplingConfig,
    *,
    row_keys: jax.Array | None = None,
    segment_ids: jax.Array | None = None,
) -> SampleOutput:
    """Sample `config.max_new_tokens` tokens after each left-padded prompt.

    Args:
      model: a decoder following the `sera_jax.models.decoder` contract
        (`logits, cache = model(tokens, positions, cache, attention_mask)`).
      prompt_tokens: int32 [P, W], left-padded.
      prompt_mask: bool [P, W], True on real tokens; every row needs at least one, and
        real tokens must be contiguous at the right end (left padding).
      key: PRNG key; row r uses `fold_in(key, r)`. Ignored when `row_keys` is given; may be
        None for greedy decoding.
      config: a `SamplingConfig`.
      row_keys: optional per-row keys [B] (typed) or [B, 2] (raw uint32), e.g.
        `fold_in(key, prompt_id * n + sample_index)`, so that a row's sample does not
        depend on which other rows share the batch.
      segment_ids: optional int [B] in [0, P): row r continues prompt `segment_ids[r]` (the
        flat rollout batch of `sera_jax.estimators.segment_ids_from_counts`). Each distinct
        prompt is prefilled once and its KV cache copied to its rows, instead of prefilling
        B rows. Default: B = P, row r continues prompt r.

    Returns a `SampleOutput` with B rows. The prompts are prefilled into a W-slot cache;
    decoding ends on a fresh `cache_length(W, config)`-slot cache allocated inside the
    jitted program (earlier phases use smaller ones). Use `generate_with_cache` to recycle
    the full-size buffer (donated) across calls.
    """
    output, _ = _run(model, prompt_tokens, prompt_mask, key, config, row_keys, segment_ids,
                     cache=None)
    return output


def generate_with_cache(
    model: nnx.Module,
    prompt_tokens: jax.Array,
    prompt_mask: jax.Array,
    key: jax.Array | None,
    config: SamplingConfig,
    cache: KVCache,
    *,
    row_keys: jax.Array | None = None,
    segment_ids: jax.Array | None = None,
) -> tuple[SampleOutput, KVCache]:
    """`generate` decoding into a caller-provided cache, which is DONATED.

    `cache` (e.g. from `init_cache(cfg, B, cache_length(W, config))` with the caller's
    sharding, or the cache returned by the previous call) must have batch B and exactly
    `cache_length(W, config)` slots; its contents are ignored (overwritten / invalidated).
    The input buffer is consumed: pass the returned cache to the next call, which then
    reuses the same memory and the same compiled program.
    """
    batch = prompt_tokens.shape[0] if segment_ids is None else segment_ids.shape[0]
    width = prompt_tokens.shape[1]
    need = cache_length(width, config)
    if cache.valid.shape != (batch, need):
        raise ValueError(
            f"cache has batch {cache.valid.shape[0]} and {cache.valid.shape[1]} slots; need "
            f"batch {batch} and cache_length({width}, config) = {need} slots"
        )
    given = jax.tree.leaves(cache.k)[0].dtype
    if config.cache_dtype is not None and given != jnp.dtype(config.cache_dtype):
        raise ValueError(f"cache holds {given} keys/values; config.cache_dtype is "
                         f"{config.cache_dtype!r} (make it with init_cache(cfg, ..., dtype))")
    return _run(model, prompt_tokens, prompt_mask, key, config, row_keys, segment_ids,
                cache=cache)


def distinct_prompt_chunk(row_prompt: np.ndarray, slots: int | None = None
                          ) -> tuple[np.ndarray, np.ndarray] | None:
    """The distinct prompts of one chunk of rows, for `generate(..., segment_ids=)`.

    Returns `(prompt_index [U], segment_ids [R])` with `row_prompt == prompt_index[segment_ids]`:
    U = `slots` when given (a static shape for any allocation; at least the distinct count),
    else the distinct count rounded up to a power of two (the compiled shape changes rarely
    as the count moves); padded with repeats of the last id (prefilled, read by no row).
    None when U would not be smaller than R (prefilling the rows is then no more work).
    """
    row_prompt = np.asarray(row_prompt)
    distinct = np.unique(row_prompt)
    size = 1 << max(0, int(distinct.size) - 1).bit_length() if slots is None else int(slots)
    if size < distinct.size:
        raise ValueError(f"slots={slots} is fewer than the chunk's {distinct.size} distinct "
                         "prompts")
    if size >= row_prompt.size:
        return None
    index = np.concatenate([distinct, np.full(size - distinct.size, distinct[-1])])
    return index, np.searchsorted(distinct, row_prompt).astype(np.int32)


def generate_rows(
    model: nnx.Module,
    prompt_tokens: np.ndarray,
    prompt_mask: np.ndarray,
    row_prompt: np.ndarray,
    row_keys: jax.Array,
    config: SamplingConfig,
    *,
    rows_per_call: int,
    mesh: Mesh | None = None,
    prompt_slots: int | None = None,
) -> SampleOutput:
    """Sample one completion per row r of prompt `row_prompt[r]`, on the host side of a run.

    `prompt_tokens` / `prompt_mask`: host [P, W] left-padded prompts; `row_prompt`: int [B]
    in [0, P); `row_keys`: [B] keys (row r's sample depends on its key and prompt only, not
    on the chunking). Rows go through `generate` `rows_per_call` at a time (a multiple of
    the mesh's batch shards; the last chunk is padded with copies of the last row, which are
    dropped). On one batch shard each call prefills its *distinct* prompts once
    (`distinct_prompt_chunk`, `prompt_slots` of them when given), the N rollouts of a prompt
    sharing its KV cache. On several batch shards every row is prefilled where it lives:
    copying a shared prompt's cache to rows on other devices would be a cross-device gather
    of the prompt cache (a shard-local version would need `shard_map`; not built). With a
    mesh, rows are put on its batch sharding and the decoder runs under it. Returns a
    `SampleOutput` of host NumPy arrays with B rows.
    """
    row_prompt = np.asarray(row_prompt)
    total = row_prompt.shape[0]
    multiple = shd.batch_divisor(mesh) if mesh is not None else 1
    if rows_per_call < 1 or rows_per_call % multiple:
        raise ValueError(f"rows_per_call={rows_per_call} must be a positive multiple of the "
                         f"{multiple} batch shards")
    if row_prompt.ndim != 1 or total == 0:
        raise ValueError(f"row_prompt must be a non-empty 1-D array; got shape "
                         f"{row_prompt.shape}")
    if row_prompt.min() < 0 or row_prompt.max() >= prompt_tokens.shape[0]:
        raise ValueError(f"row_prompt spans [{row_prompt.min()}, {row_prompt.max()}]; allowed "
                         f"range is [0, {prompt_tokens.shape[0]}) (one id per prompt row)")
    if row_keys.shape[0] != total:
        raise ValueError(f"row_keys has {row_keys.shape[0]} rows; row_prompt has {total}")

    def place(tree):
        return shd.shard_batch(tree, mesh) if mesh is not None else jax.tree.map(jnp.asarray,
                                                                                  tree)

    outs = []
    for start in range(0, total, rows_per_call):
        sel = np.minimum(np.arange(start, start + rows_per_call), total - 1)
        chunk = distinct_prompt_chunk(row_prompt[sel], prompt_slots) if multiple == 1 else None
        if chunk is None:
            toks, mask = place((prompt_tokens[row_prompt[sel]], prompt_mask[row_prompt[sel]]))
            segment_ids = None
        else:
            index, local = chunk
            toks, mask = place((prompt_tokens[index], prompt_mask[index]))
            segment_ids = place(local)
        with jax.set_mesh(mesh) if mesh is not None else contextlib.nullcontext():
            out = generate(model, toks, mask, None, config, row_keys=row_keys[sel],
                           segment_ids=segment_ids)
        keep = min(rows_per_call, total - start)
        outs.append(jax.tree.map(lambda x, keep=keep: shd.to_host(x)[:keep], out))
    return jax.tree.map(lambda *xs: np.concatenate(xs, axis=0), *outs)


def _run(model, prompt_tokens, prompt_mask, key, config, row_keys, segment_ids, cache):
    cfg = model.cfg
    config.validate_vocab(cfg.vocab_size)
    prompt_tokens = jnp.asarray(prompt_tokens, jnp.int32)
    prompt_mask = jnp.asarray(prompt_mask, bool)
    _validate_prompts(prompt_tokens, prompt_mask, cfg.vocab_size)
    batch = prompt_tokens.shape[0]
    if segment_ids is not None:
        segment_ids = jnp.asarray(segment_ids, jnp.int32)
        _validate_segment_ids(segment_ids, prompt_tokens.shape[0])
        batch = segment_ids.shape[0]
    if row_keys is None:
        if key is None:
            if not config.greedy:
                raise ValueError("key=None needs greedy=True or explicit row_keys")
            key = jax.random.key(0)  # unused by greedy decoding; keeps one code path
        row_keys = default_row_keys(key, batch)
    elif row_keys.shape[0] != batch:
        raise ValueError(f"row_keys has {row_keys.shape[0]} rows; the batch has {batch}")
    graphdef, state = nnx.split(model)
    return _generate_jit(
        graphdef, state, prompt_tokens, prompt_mask, segment_ids, row_keys, cache,
        config=config,
    )


def _validate_prompts(tokens: jax.Array, mask: jax.Array, vocab_size: int) -> None:
    """Host-side checks (skipped under tracing, where values are unknown)."""
    if tokens.ndim != 2 or mask.shape != tokens.shape:
        raise ValueError(
            f"prompt_tokens {tokens.shape} and prompt_mask {mask.shape} must both be [P, W]"
        )
    if isinstance(tokens, jax.core.Tracer) or isinstance(mask, jax.core.Tracer):
        return
    # Reductions run where the data lives (sharded arrays included); only scalars come back.
    if not bool(jnp.all(jnp.any(mask, axis=1))):
        rows = np.flatnonzero(~np.asarray(jnp.any(mask, axis=1)))
        raise ValueError(f"prompt_mask rows {rows[:8].tolist()} have no real token")
    if not bool(jnp.all(mask[:, 1:] >= mask[:, :-1])):
        raise ValueError(
            "prompt_mask is not left-padded (a pad follows a real token); build prompts "
            "with sera_jax.sampling.left_pad"
        )
    if not bool(jnp.all(jnp.where(mask, (tokens >= 0) & (tokens < vocab_size), True))):
        raise ValueError(f"prompt_tokens has ids outside [0, {vocab_size})")


def _validate_segment_ids(segment_ids: jax.Array, num_prompts: int) -> None:
    if segment_ids.ndim != 1:
        raise ValueError(f"segment_ids must be 1-D [B]; got shape {segment_ids.shape}")
    if isinstance(segment_ids, jax.core.Tracer) or not segment_ids.size:
        return
    lo, hi = int(jnp.min(segment_ids)), int(jnp.max(segment_ids))
    if lo < 0 or hi >= num_prompts:
        raise ValueError(
            f"segment_ids span [{lo}, {hi}]; allowed range is [0, {num_prompts}) (one id per "
            "row of prompt_tokens)"
        )


@jax.jit(static_argnames=("graphdef", "config"), donate_argnames=("cache",))
def _generate_jit(
    graphdef, state, prompt_tokens, prompt_mask, segment_ids, row_keys, cache, *, config
):
    model = nnx.merge(graphdef, state)
    cfg = model.cfg
    num_prompts, width = prompt_tokens.shape
    batch = row_keys.shape[0]
    steps = config.max_new_tokens
    slots = cache_length(width, config)
    # The prompt cache takes the final cache's dtype: the configured one, else that of a
    # caller's (donated) cache, else the model's compute dtype (init_cache's None).
    cache_dtype = config.cache_dtype
    if cache_dtype is None and cache is not None:
        cache_dtype = jax.tree.leaves(cache.k)[0].dtype

    # Prefill each distinct prompt once into a W-slot cache (attention over W, not all
    # `slots`), a chunk of rows at a time, then copy its keys/values to the rows that
    # continue it.
    def prefill(args):
        tokens, mask = args
        logits, prefilled = model(
            tokens,
            positions_from_mask(mask),
            cache=init_cache(cfg, tokens.shape[0], width, cache_dtype),
            attention_mask=mask,
            last_only=True,  # left padding: every row's last prompt token is at W - 1
        )
        return logits[:, -1], prefilled.k, prefilled.v

    logits, prefilled_k, prefilled_v = map_row_chunks(
        prefill, (prompt_tokens, prompt_mask), width, _PREFILL_CHUNK_TOKENS)
    mask = prompt_mask
    if segment_ids is not None:
        logits, mask = logits[segment_ids], mask[segment_ids]
        prefilled_k, prefilled_v = (
            jax.tree.map(lambda x: jnp.take(x, segment_ids, axis=0), kv)
            for kv in (prefilled_k, prefilled_v))  # rows are axis 0 in both cache layouts

    # Decode phase i runs on a cache of exactly the slots its steps can reach (growing at
    # each phase boundary; the last phase is the full, possibly donated, buffer).
    ends = decode_phase_ends(steps)
    phase_slots = [width + end - 1 for end in ends] or [slots]
    full = init_cache(cfg, batch, slots, cache_dtype) if cache is None else cache
    prompt_cache = KVCache(
        k=prefilled_k, v=prefilled_v, valid=mask, index=jnp.asarray(width, full.index.dtype))
    cache = _grow_cache(prompt_cache, phase_slots[0], full)

    def draw(logits, step):
        keys = jax.vmap(lambda k: jax.random.fold_in(k, step))(row_keys)
        return sample_tokens(logits, keys, config)

    first, lp, slp = draw(logits, 0)
    stop_ids = jnp.asarray(config.stop_ids, jnp.int32)
    done = jnp.isin(first, stop_ids)
    buffers = (
        jnp.full((batch, steps), config.pad_id, jnp.int32).at[:, 0].set(first),
        jnp.zeros((batch, steps), jnp.float32).at[:, 0].set(lp),
        jnp.zeros((batch, steps), jnp.float32).at[:, 0].set(slp),
    )
    prompt_len = jnp.sum(mask, axis=1, dtype=jnp.int32)

    def body(carry):
        # Feed token step-1 (at position prompt_len + step - 1, slot width + step - 1),
        # sample token `step`.
        step, last, done, lengths, cache, buffers = carry
        positions = (prompt_len + step - 1)[:, None]
        logits, cache = model(last[:, None], positions, cache=cache, attention_mask=~done[:, None])
        token, lp, slp = draw(logits[:, 0], step)
        token = jnp.where(done, config.pad_id, token)
        values = (token, jnp.where(done, 0.0, lp), jnp.where(done, 0.0, slp))
        buffers = tuple(
            jax.lax.dynamic_update_slice_in_dim(buf, val[:, None], step, axis=1)
            for buf, val in zip(buffers, values)
        )
        lengths = lengths + (~done).astype(jnp.int32)  # rows still running got a token
        done = done | jnp.isin(token, stop_ids)
        return step + 1, token, done, lengths, cache, buffers

    step, last, lengths = jnp.int32(1), first, jnp.ones((batch,), jnp.int32)
    for end, size in zip(ends, phase_slots):
        # Steps before `end` write slots < width + end - 1 = size.
        cache = _grow_cache(cache, size, full)
        step, last, done, lengths, cache, buffers = jax.lax.while_loop(
            lambda carry, end=end: (carry[0] < end) & ~jnp.all(carry[2]),
            body,
            (step, last, done, lengths, cache, buffers),
        )
    tokens, logprobs, sampling_logprobs = buffers
    output = SampleOutput(
        tokens=tokens,
        logprobs=logprobs,
        sampling_logprobs=sampling_logprobs,
        lengths=lengths,
        truncated=~done,
    )
    return output, cache


def _grow_cache(cache: KVCache, slots: int, full: KVCache) -> KVCache:
    """`cache` copied into the first slots of a `slots`-slot cache; new slots are invalid.

    `full` is the final (caller's, possibly donated) cache: when `slots` is its size the copy
    goes into its buffers, overwriting them in place; else into fresh zeros.
    """
    if cache.max_len == slots:
        return cache

    def grow(old, target, slot_axis):
        if target.shape[slot_axis] != slots:
            shape = list(target.shape)
            shape[slot_axis] = slots
            target = jnp.zeros(shape, target.dtype)
        return jax.lax.dynamic_update_slice(target, old.astype(target.dtype), (0,) * old.ndim)

    batch = cache.valid.shape[0]
    return KVCache(
        # Keys [B, (L,) Hkv, Dh, S], values [B, (L,) Hkv, S, Dh]: per-layer tuples or the
        # stacked arrays of a scan_layers model.
        k=jax.tree.map(lambda old, t: grow(old, t, old.ndim - 1), cache.k, full.k),
        v=jax.tree.map(lambda old, t: grow(old, t, old.ndim - 2), cache.v, full.v),
        valid=jnp.zeros((batch, slots), bool).at[:, :cache.max_len].set(cache.valid),
        index=cache.index,
    )


def expand_prompts(
    prompt_tokens: jax.Array,
    prompt_mask: jax.Array,
    counts: jax.Array,
    budget: int,
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """The flat rollout batch: prompt q repeated `counts[q]` times, `budget` rows in all.

    `segment_ids = segment_ids_from_counts(counts, budget)` (rows of one prompt contiguous,
    static shape `[budget]` however the counts move). Returns `(tokens [budget, W],
    mask [budget, W], segment_ids int32 [budget])`. For sampling, pass `segment_ids` to
    `generate` with the un-expanded prompts instead (each prompt is then prefilled once);
    the expanded tokens are for scoring full sequences. Raises ValueError when concrete
    counts are negative or do not sum to `budget`.
    """
    counts = jnp.asarray(counts)
    if counts.shape != (prompt_tokens.shape[0],):
        raise ValueError(
            f"counts has shape {counts.shape}; expected ({prompt_tokens.shape[0]},), one per prompt"
        )
    segment_ids = segment_ids_from_counts(counts, budget)
    return prompt_tokens[segment_ids], prompt_mask[segment_ids], segment_ids
