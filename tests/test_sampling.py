"""Tests of sera_jax.sampling: filtering, padding invariance, stops, early exit, log-probs,
donated-cache reuse and sharding."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from sera_jax import sampling
from sera_jax.models.decoder import (
    Decoder,
    DecoderConfig,
    convert_layout,
    init_cache,
    positions_from_mask,
)
from sera_jax.models.logprobs import token_logprobs
from sera_jax.sampling import (
    TOP_P_PREFIX,
    SamplingConfig,
    expand_prompts,
    filter_logits,
    generate,
    generate_with_cache,
    left_pad,
    sample_tokens,
)
from sera_jax.sampling_draw import _first_above, first_argmax, inverse_cdf, token_logprob

VOCAB = 32
TINY = DecoderConfig(
    vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=2,
    num_kv_heads=1, rope_theta=1e4,
)
PROMPTS = [
    np.array([5, 9, 11], np.int32),
    np.arange(4, 11, dtype=np.int32),
    np.array([7, 3, 21, 30, 2, 8, 8, 1, 19, 4], np.int32),
    np.arange(20, 26, dtype=np.int32),
]
WIDTH = 10
# Two configurations shared by the tests so that the compiled programs are reused
# (every distinct (config, shapes, sharding) costs an XLA compile of a few seconds).
GREEDY = SamplingConfig(max_new_tokens=6, greedy=True)
SAMPLED = SamplingConfig(max_new_tokens=6, temperature=0.9, top_k=20)


@pytest.fixture(scope="module")
def model():
    # Larger-than-default init so the random policy is far from uniform (distinct argmaxes).
    return Decoder(TINY.replace(initializer_range=0.3), rngs=nnx.Rngs(0))


def _batch():
    tokens, mask = left_pad(PROMPTS, WIDTH, pad_id=0)
    return jnp.asarray(tokens), jnp.asarray(mask)


# ----------------------------------------------------------------------------- filtering


def _reference_filter(logits, temperature, top_k, top_p):
    """Straightforward NumPy re-statement of temperature -> top-k -> top-p (HF semantics)."""
    z = logits.astype(np.float64) / temperature
    if top_k:
        kth = np.sort(z)[::-1][top_k - 1]
        z = np.where(z < kth, -np.inf, z)
    if top_p < 1:
        order = np.argsort(-z, kind="stable")
        p = np.exp(z[order] - z[order][0])
        p /= p.sum()
        keep_sorted = (np.cumsum(p) - p) < top_p
        keep = np.zeros_like(keep_sorted)
        keep[order] = keep_sorted
        z = np.where(keep, z, -np.inf)
    return z


@pytest.mark.parametrize(
    "temperature,top_k,top_p", [(1.0, 0, 1.0), (0.7, 5, 1.0), (1.3, 0, 0.8), (0.5, 12, 0.9)]
)
def test_filter_logits_matches_reference(temperature, top_k, top_p):
    logits = np.asarray(jax.random.normal(jax.random.key(1), (6, VOCAB))) * 3
    cfg = SamplingConfig(max_new_tokens=1, temperature=temperature, top_k=top_k, top_p=top_p)
    got = np.asarray(filter_logits(jnp.asarray(logits), cfg))
    for row in range(6):
        want = _reference_filter(logits[row], temperature, top_k, top_p)
        np.testing.assert_array_equal(np.isinf(got[row]), np.isinf(want))
        finite = np.isfinite(want)
        np.testing.assert_allclose(got[row][finite], want[finite], rtol=1e-6)
    if top_k:
        assert (np.isfinite(got).sum(-1) <= top_k).all()


@pytest.mark.parametrize("scale", [8.0, 0.05])  # peaked: prefix holds top_p; flat: full sort
def test_top_p_on_a_large_vocabulary_matches_reference(scale):
    vocab = 3 * TOP_P_PREFIX
    logits = np.asarray(jax.random.normal(jax.random.key(2), (4, vocab))) * scale
    cfg = SamplingConfig(max_new_tokens=1, top_p=0.9)
    got = np.asarray(filter_logits(jnp.asarray(logits), cfg))
    kept = np.isfinite(got).sum(-1)
    # Both branches are exercised: a peaked row keeps few tokens, a flat row more than the prefix.
    assert (kept < TOP_P_PREFIX).all() if scale > 1 else (kept > TOP_P_PREFIX).all()
    for row in range(4):
        want = _reference_filter(logits[row], 1.0, 0, 0.9)
        np.testing.assert_array_equal(np.isinf(got[row]), np.isinf(want))


@pytest.mark.parametrize("draw", ["fast", "inverse_cdf"])
def test_sample_frequencies_follow_filtered_distribution(draw):
    """Controlled distribution: p = (.5, .25, .15, .1) with top_p = .7 keeps {0, 1} -> (2/3, 1/3);
    top_k = 3 at T = 2 keeps {0, 1, 2} with probabilities proportional to sqrt(p)."""
    p = np.array([0.5, 0.25, 0.15, 0.1])
    n = 20_000
    logits = jnp.tile(jnp.log(jnp.asarray(p, jnp.float32)), (n, 1))
    keys = jax.random.split(jax.random.key(3), n)
    cases = [
        (SamplingConfig(max_new_tokens=1, top_p=0.7, token_draw=draw),
         np.array([2 / 3, 1 / 3, 0, 0])),
        (SamplingConfig(max_new_tokens=1, top_k=3, temperature=2.0, token_draw=draw),
         np.sqrt(p) * np.array([1, 1, 1, 0]) / np.sqrt(p)[:3].sum()),
        (SamplingConfig(max_new_tokens=1, token_draw=draw), p),
    ]
    for cfg, expected in cases:
        tokens, lp, slp = sample_tokens(logits, keys, cfg)
        freq = np.bincount(np.asarray(tokens), minlength=4) / n
        # 5 standard errors of a binomial proportion.
        tol = 5 * np.sqrt(expected * (1 - expected) / n) + 1e-9
        assert (np.abs(freq - expected) <= tol).all(), (cfg, freq, expected)
        tokens = np.asarray(tokens)
        np.testing.assert_allclose(np.asarray(lp), np.log(p[tokens]), rtol=1e-5)
        np.testing.assert_allclose(np.asarray(slp), np.log(expected[tokens]), rtol=1e-5)


def test_greedy_is_argmax_with_zero_sampling_logprob():
    logits = jax.random.normal(jax.random.key(0), (5, VOCAB))
    tokens, lp, slp = sample_tokens(logits, None, SamplingConfig(max_new_tokens=1, greedy=True))
    np.testing.assert_array_equal(tokens, jnp.argmax(logits, -1))
    np.testing.assert_allclose(lp, jnp.max(jax.nn.log_softmax(logits), -1), rtol=1e-6)
    assert not np.asarray(slp).any()


# ----------------------------------------------- fast token draw == the reference draw

DRAW_CASES = [
    dict(),
    dict(greedy=True),
    dict(temperature=0.6),
    dict(temperature=0.7, top_p=0.9),
    dict(top_k=5, temperature=1.3),
    dict(top_k=40, top_p=0.8),
]


@pytest.mark.parametrize("kwargs", DRAW_CASES, ids=lambda kw: str(kw) or "plain")
def test_fast_token_draw_matches_reference(kwargs):
    """token_draw="fast" (sampling_draw) gives the tokens of the reference draw
    (`jax.random.categorical` / `jnp.argmax`) for the same keys, and its log-probs."""
    logits = 3.0 * jax.random.normal(jax.random.key(1), (64, 1000))
    keys = jax.random.split(jax.random.key(2), 64)
    fast = sample_tokens(logits, keys, SamplingConfig(max_new_tokens=1, **kwargs))
    ref = sample_tokens(logits, keys,
                        SamplingConfig(max_new_tokens=1, token_draw="reference", **kwargs))
    np.testing.assert_array_equal(fast[0], ref[0])
    for got, want in zip(fast[1:], ref[1:]):
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    assert len(np.unique(np.asarray(fast[0]))) > 8  # a real draw, not one token


def test_inverse_cdf_draws_the_softmax_distribution_over_blocks():
    """The two-level inversion over a vocabulary of several (padded) blocks: frequencies
    within 5 standard errors of softmax(x) on every token, never a -inf (filtered) token."""
    vocab, n = 600, 40_000  # 3 blocks of 256, the last one padded
    x = jnp.where(jnp.arange(vocab) % 7 == 0, -jnp.inf,
                  jax.random.normal(jax.random.key(5), (vocab,)))
    x = x.at[jnp.asarray([3, 300, 599])].set(3.0)  # mass in every block
    keys = jax.random.split(jax.random.key(6), n)
    tokens = np.asarray(inverse_cdf(keys, jnp.tile(x, (n, 1))))
    p = np.asarray(jax.nn.softmax(x))
    freq = np.bincount(tokens, minlength=vocab) / n
    assert not freq[p == 0].any()
    assert (np.abs(freq - p) <= 5 * np.sqrt(p * (1 - p) / n) + 1e-9).all()


def test_first_above_never_returns_a_massless_index():
    cum = jnp.asarray([[1.0, 2.0, 2.0, 3.0], [1.0, 2.0, 2.0, 2.0], [1.0, 2.0, 2.0, 3.0]])
    positive = jnp.asarray([[1, 1, 0, 1], [1, 1, 0, 0], [1, 1, 0, 1]], bool)
    u = jnp.asarray([2.0, 2.0, 0.5])  # row 1: u at the (rounded) total -> last with mass
    np.testing.assert_array_equal(_first_above(cum, u, positive), [3, 1, 0])


def test_first_argmax_is_argmax_with_ties_and_infinities():
    x = jnp.asarray([[1.0, 3.0, 3.0, 2.0], [-jnp.inf] * 4, [0.0, 0.0, 0.0, 0.0],
                     [-jnp.inf, 5.0, jnp.inf, jnp.inf]])
    np.testing.assert_array_equal(first_argmax(x), jnp.argmax(x, axis=-1))
    y = jax.random.normal(jax.random.key(0), (3, 5, 257))
    np.testing.assert_array_equal(first_argmax(y), jnp.argmax(y, axis=-1))


def test_token_logprob_is_log_softmax_gathered():
    logits = 5.0 * jax.random.normal(jax.random.key(4), (6, 300))
    tokens = jnp.asarray([0, 299, 17, 5, 100, 17], jnp.int32)
    want = jnp.take_along_axis(jax.nn.log_softmax(logits, -1), tokens[:, None], -1)[:, 0]
    np.testing.assert_allclose(token_logprob(logits, tokens), want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("cfg", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
def test_generate_fast_draw_matches_reference_draw(model, cfg):
    """The whole sampler with the fast draw == with the reference draw (today's baseline
    of benchmarks/smollm2_decode_bench.py), tokens exactly, log-probs to rounding."""
    tokens, mask = _batch()
    key = jax.random.key(11)
    fast = generate(model, tokens, mask, key, cfg)
    ref = generate(model, tokens, mask, key, dataclasses.replace(cfg, token_draw="reference"))
    np.testing.assert_array_equal(fast.tokens, ref.tokens)
    np.testing.assert_array_equal(fast.lengths, ref.lengths)
    np.testing.assert_allclose(fast.logprobs, ref.logprobs, atol=1e-6)
    np.testing.assert_allclose(fast.sampling_logprobs, ref.sampling_logprobs, atol=1e-6)


# ------------------------------------------------------------------- padding invariance


@pytest.mark.parametrize("cfg", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
def test_batched_equals_one_at_a_time(model, cfg):
    """Left-padded batch == each prompt alone, unpadded (sampled: same per-row keys)."""
    tokens, mask = _batch()
    row_keys = jax.random.split(jax.random.key(7), len(PROMPTS))
    batched = generate(model, tokens, mask, None, cfg, row_keys=row_keys)
    for row in (0, 1):  # the padded rows (3 and 7 real tokens in a width of 10)
        prompt = PROMPTS[row]
        single = generate(
            model, jnp.asarray(prompt)[None], jnp.ones((1, len(prompt)), bool), None, cfg,
            row_keys=row_keys[row : row + 1],
        )
        np.testing.assert_array_equal(single.tokens[0], batched.tokens[row])
        np.testing.assert_allclose(single.logprobs[0], batched.logprobs[row], atol=1e-5)
    # Guard against a vacuous pass: the rows do differ from one another.
    assert len({tuple(np.asarray(r)) for r in batched.tokens}) == len(PROMPTS)


def test_default_row_keys_depend_on_row_index_only(model):
    """Without row_keys, row r uses fold_in(key, r): replacing row 3's prompt leaves rows
    0..2 unchanged, and two rows with the same prompt get different samples."""
    tokens, mask = _batch()
    key = jax.random.key(11)
    out = generate(model, tokens, mask, key, SAMPLED)
    rows = jnp.array([0, 1, 2, 0])
    dup = generate(model, tokens[rows], mask[rows], key, SAMPLED)
    np.testing.assert_array_equal(dup.tokens[:3], out.tokens[:3])
    assert not np.array_equal(dup.tokens[3], dup.tokens[0])


# ------------------------------------------------------------------ stops and early exit


class CountingDecoder(Decoder):
    """Counts forward passes actually executed (including inside the while loop)."""

    calls = 0

    def __call__(self, *args, **kwargs):
        jax.debug.callback(CountingDecoder._tick)
        return super().__call__(*args, **kwargs)

    @staticmethod
    def _tick():
        CountingDecoder.calls += 1


def test_stop_tokens_and_early_exit(model):
    steps = GREEDY.max_new_tokens
    tokens, mask = _batch()
    free = generate(model, tokens, mask, None, GREEDY)
    assert free.truncated.all() and (free.lengths == steps).all()
    counting = CountingDecoder(model.cfg, rngs=nnx.Rngs(0))
    nnx.update(counting, nnx.state(model))  # same weights, a graph that counts forwards
    # Stop on a token each row emits early, so every row stops well before `steps`.
    ft = np.asarray(free.tokens)
    stop_ids = (int(ft[0, 1]), int(ft[1, 3]), int(ft[2, 2]), int(ft[3, 0]))
    cfg = SamplingConfig(steps, greedy=True, stop_ids=stop_ids, pad_id=0)
    CountingDecoder.calls = 0
    out = generate(counting, tokens, mask, None, cfg)
    jax.effects_barrier()
    for row in range(len(PROMPTS)):
        n = np.flatnonzero(np.isin(ft[row], stop_ids))[0] + 1
        assert int(out.lengths[row]) == n and not out.truncated[row]
        np.testing.assert_array_equal(out.tokens[row, :n], ft[row, :n])
        assert (np.asarray(out.tokens[row, n:]) == 0).all()
        assert (np.asarray(out.logprobs[row, n:]) == 0).all()
        np.testing.assert_allclose(out.logprobs[row, :n], free.logprobs[row, :n], atol=1e-6)
        np.testing.assert_array_equal(out.mask[row], np.arange(steps) < n)
    # Early exit: prefill + one forward per further token of the longest row (<= 4 here),
    # not prefill + steps - 1.
    assert CountingDecoder.calls == int(out.lengths.max()) < steps


# --------------------------------------------------------------------------- log-probs


def test_logprobs_match_full_forward(model):
    """out.logprobs == a no-cache forward of prompt + completion at T = 1; the sampling
    log-probs == log softmax of the filtered logits of that same forward."""
    cfg = SAMPLED
    tokens, mask = _batch()
    out = generate(model, tokens, mask, jax.random.key(5), cfg)
    full = jnp.concatenate([tokens, out.tokens], axis=1)
    full_mask = jnp.concatenate([mask, out.mask], axis=1)

    @nnx.jit
    def reference(model, full, full_mask):
        positions = positions_from_mask(full_mask)
        logits, _ = model(full, positions, attention_mask=full_mask)
        return token_logprobs(model, full, full_mask), logits

    ref, logits = reference(model, full, full_mask)
    np.testing.assert_allclose(out.logprobs, ref[:, WIDTH:] * out.mask, atol=2e-5)
    filtered = jax.nn.log_softmax(filter_logits(logits[:, WIDTH - 1 : -1], cfg), -1)
    ref_s = jnp.take_along_axis(filtered, out.tokens[..., None], -1)[..., 0]
    np.testing.assert_allclose(out.sampling_logprobs, ref_s * out.mask, atol=2e-5)
    assert (np.asarray(out.sampling_logprobs) != np.asarray(out.logprobs)).any()


# ------------------------------------------------------------ donated cache, recompiles


def test_donated_cache_reused_without_recompile(model):
    cfg = SAMPLED
    tokens, mask = _batch()
    cache = init_cache(model.cfg, len(PROMPTS), sampling.cache_length(WIDTH, cfg))
    before = sampling._generate_jit._cache_size()
    outs = []
    for seed in (0, 1, 0):
        out, new_cache = generate_with_cache(model, tokens, mask, jax.random.key(seed), cfg, cache)
        assert all(a.is_deleted() for a in jax.tree.leaves((cache.k, cache.v))), \
            "the cache buffers must be donated"
        cache = new_cache
        outs.append(out)
    assert sampling._generate_jit._cache_size() == before + 1
    # A stale, recycled cache gives the same result as a fresh one.
    np.testing.assert_array_equal(outs[0].tokens, outs[2].tokens)
    fresh = generate(model, tokens, mask, jax.random.key(0), cfg)
    np.testing.assert_array_equal(fresh.tokens, outs[0].tokens)
    with pytest.raises(ValueError, match="cache has batch"):
        generate_with_cache(model, tokens[:2], mask[:2], jax.random.key(0), cfg, cache)


def test_decode_phase_ends():
    assert sampling.decode_phase_ends(1) == []
    for steps in (2, 48, 96, 97, 180, 1024, 5000):
        ends = sampling.decode_phase_ends(steps)
        assert ends[-1] == steps and ends == sorted(set(ends)) and ends[0] > 1
        assert 1 <= len(ends) <= sampling._MAX_DECODE_PHASES
    assert len(sampling.decode_phase_ends(180)) == 3


@pytest.mark.slow  # a minute of compiles: every cache phase x prefill chunk
def test_growing_cache_phases_and_prefill_chunks_do_not_change_samples(model, monkeypatch):
    """Decoding in phases over growing caches and prefilling one prompt per chunk give the
    same tokens and log-probs as one full-size cache and a one-chunk prefill, with a fresh
    and with a donated cache."""
    cfg = SamplingConfig(max_new_tokens=12, temperature=0.9, top_k=20, stop_ids=(3,))
    tokens, mask = _batch()
    key = jax.random.key(5)

    def run_fresh():
        sampling._generate_jit.clear_cache()  # the constants are read while tracing
        return generate(model, tokens, mask, key, cfg)

    monkeypatch.setattr(sampling, "_MAX_DECODE_PHASES", 1)
    want = run_fresh()
    monkeypatch.setattr(sampling, "_MAX_DECODE_PHASES", 4)
    monkeypatch.setattr(sampling, "_DECODE_PHASE_STEPS", 3)  # 11 // 3 = 3 phases
    monkeypatch.setattr(sampling, "_PREFILL_CHUNK_TOKENS", WIDTH)  # one prompt per chunk
    assert len(sampling.decode_phase_ends(cfg.max_new_tokens)) == 3
    got = run_fresh()
    cache = init_cache(model.cfg, len(PROMPTS), sampling.cache_length(WIDTH, cfg))
    donated, new_cache = generate_with_cache(model, tokens, mask, key, cfg, cache)
    sampling._generate_jit.clear_cache()  # drop the programs traced with patched constants
    assert all(a.is_deleted() for a in jax.tree.leaves((cache.k, cache.v)))
    assert new_cache.max_len == cache.max_len
    for out in (got, donated):
        np.testing.assert_array_equal(out.tokens, want.tokens)
        np.testing.assert_array_equal(out.lengths, want.lengths)
        np.testing.assert_allclose(out.logprobs, want.logprobs, atol=1e-5)
    assert int(np.max(want.lengths)) > 6  # the later phases did sample tokens


# ---------------------------------------------------------------------------- sharding


def test_sharded_batch_and_params_match_unsharded(model):
    devices = np.array(jax.devices()[:4]).reshape(2, 2)
    mesh = Mesh(devices, ("data", "tensor"))
    cfg = SAMPLED
    tokens, mask = _batch()
    key = jax.random.key(2)
    want = generate(model, tokens, mask, key, cfg)
    graphdef, state = nnx.split(model)
    # Shard every weight's last axis over "tensor" where it divides; batch over "data".
    def shard(x):
        spec = P(*([None] * (x.ndim - 1)), "tensor") if x.shape[-1] % 2 == 0 else P()
        return jax.device_put(x, NamedSharding(mesh, spec))
    sharded = nnx.merge(graphdef, jax.tree.map(shard, state))
    batch_sharding = NamedSharding(mesh, P("data", None))
    got = generate(sharded, jax.device_put(tokens, batch_sharding),
                   jax.device_put(mask, batch_sharding), key, cfg)
    np.testing.assert_array_equal(got.tokens, want.tokens)
    np.testing.assert_allclose(got.logprobs, want.logprobs, atol=1e-5)


# ----------------------------------------------------------------- rollout batch helper


def test_expand_prompts():
    tokens, mask = _batch()
    counts = jnp.array([2, 0, 3, 1])
    flat_tokens, flat_mask, seg = expand_prompts(tokens, mask, counts, budget=6)
    rows = [0, 0, 2, 2, 2, 3]
    np.testing.assert_array_equal(seg, rows)
    np.testing.assert_array_equal(flat_tokens, np.asarray(tokens)[rows])
    np.testing.assert_array_equal(flat_mask, np.asarray(mask)[rows])
    with pytest.raises(ValueError, match="total=7"):
        expand_prompts(tokens, mask, counts, budget=7)
    with pytest.raises(ValueError, match="counts has shape"):
        expand_prompts(tokens, mask, jnp.array([5]), budget=5)


def test_segment_ids_prefill_each_prompt_once(model):
    """Sampling the flat rollout batch from the P distinct prompts + segment_ids equals
    sampling the expanded [B, W] prompts row by row (same row keys)."""
    tokens, mask = _batch()
    counts = jnp.array([1, 0, 2, 1])
    flat_tokens, flat_mask, seg = expand_prompts(tokens, mask, counts, budget=4)
    row_keys = jax.random.split(jax.random.key(4), 4)
    want = generate(model, flat_tokens, flat_mask, None, SAMPLED, row_keys=row_keys)
    got = generate(model, tokens, mask, None, SAMPLED, row_keys=row_keys, segment_ids=seg)
    np.testing.assert_array_equal(got.tokens, want.tokens)
    np.testing.assert_allclose(got.logprobs, want.logprobs, atol=1e-5)
    assert not np.array_equal(got.tokens[1], got.tokens[2])  # same prompt, own randomness
    with pytest.raises(ValueError, match="segment_ids span"):
        generate(model, tokens, mask, None, SAMPLED, row_keys=row_keys, segment_ids=seg + 2)


def test_distinct_prompt_chunk():
    """The chunk's distinct prompts, padded to a power of two (or to `slots`) with repeats;
    the local ids map every row back to its prompt."""
    rows = np.array([3, 3, 3, 7, 7, 9, 9, 9, 9, 12, 12, 12, 12, 12, 12, 12])
    index, local = sampling.distinct_prompt_chunk(rows)
    assert index.tolist() == [3, 7, 9, 12]
    np.testing.assert_array_equal(index[local], rows)
    index, local = sampling.distinct_prompt_chunk(rows[:9])  # 3 distinct -> 4 slots
    assert index.tolist() == [3, 7, 9, 9] and local.dtype == np.int32
    np.testing.assert_array_equal(index[local], rows[:9])
    index, _ = sampling.distinct_prompt_chunk(rows, slots=8)
    assert index.shape == (8,) and set(index.tolist()) == {3, 7, 9, 12}
    # As many slots as rows: the rows are prefilled themselves.
    assert sampling.distinct_prompt_chunk(np.array([0, 1, 2, 2])) is None
    assert sampling.distinct_prompt_chunk(rows, slots=16) is None
    with pytest.raises(ValueError, match="slots=3 is fewer than the chunk's 4"):
        sampling.distinct_prompt_chunk(rows, slots=3)


def _spy_generate(monkeypatch):
    """Record (prompt rows, with segment_ids?) of every `sampling.generate` call."""
    calls, real = [], sampling.generate

    def spy(model, toks, *args, **kwargs):
        calls.append((toks.shape[0], kwargs.get("segment_ids") is not None))
        return real(model, toks, *args, **kwargs)

    monkeypatch.setattr(sampling, "generate", spy)
    return calls


def test_generate_rows_prefills_distinct_prompts_per_chunk(model, monkeypatch):
    """`generate_rows` gives every row the tokens of sampling its expanded prompt row with
    its key, for any chunking (the last chunk is padded with the last row), while each call
    prefills only the chunk's distinct prompts (4 for 12 rows in one call; 1-4 for 5)."""
    tokens, mask = _batch()
    row_prompt = np.repeat(np.arange(4), 3)
    row_keys = jax.random.split(jax.random.key(7), 12)
    want = generate(model, tokens[row_prompt], mask[row_prompt], None, SAMPLED,
                    row_keys=row_keys)
    calls = _spy_generate(monkeypatch)
    # rows 0-4, 5-9, 10-11 (+ three copies of row 11): 2, 3 (4 slots), 1 prompts
    for rows_per_call, prefills in ((12, [(4, True)]), (5, [(2, True), (4, True), (1, True)])):
        calls.clear()
        got = sampling.generate_rows(model, np.asarray(tokens), np.asarray(mask), row_prompt,
                                     row_keys, SAMPLED, rows_per_call=rows_per_call)
        assert isinstance(got.tokens, np.ndarray) and got.tokens.shape == (12, 6)
        np.testing.assert_array_equal(got.tokens, want.tokens)
        np.testing.assert_allclose(got.logprobs, want.logprobs, atol=1e-5)
        np.testing.assert_array_equal(got.lengths, want.lengths)
        assert calls == prefills, rows_per_call
    calls.clear()
    sampling.generate_rows(model, np.asarray(tokens), np.asarray(mask), row_prompt, row_keys,
                           SAMPLED, rows_per_call=12, prompt_slots=8)
    assert calls == [(8, True)]  # a fixed number of slots
    args = (model, np.asarray(tokens), np.asarray(mask))
    with pytest.raises(ValueError, match="rows_per_call=0"):
        sampling.generate_rows(*args, row_prompt, row_keys, SAMPLED, rows_per_call=0)
    with pytest.raises(ValueError, match="row_keys has 11 rows; row_prompt has 12"):
        sampling.generate_rows(*args, row_prompt, row_keys[:11], SAMPLED, rows_per_call=4)
    with pytest.raises(ValueError, match=r"row_prompt spans \[1, 4\]"):
        sampling.generate_rows(*args, row_prompt + 1, row_keys, SAMPLED, rows_per_call=4)


def test_generate_rows_on_several_batch_shards_prefills_rows_where_they_live(model,
                                                                             monkeypatch):
    """On a 2-shard batch mesh every row is prefilled on its own device (no cross-device
    copy of a shared prompt's cache), with the same tokens as on one device."""
    from sera_jax import sharding as shd

    tokens, mask = _batch()
    row_prompt = np.repeat(np.arange(4), 2)
    row_keys = jax.random.split(jax.random.key(3), 8)
    one = sampling.generate_rows(model, np.asarray(tokens), np.asarray(mask), row_prompt,
                                 row_keys, SAMPLED, rows_per_call=8)
    calls = _spy_generate(monkeypatch)
    two = sampling.generate_rows(model, np.asarray(tokens), np.asarray(mask), row_prompt,
                                 row_keys, SAMPLED, rows_per_call=8,
                                 mesh=shd.make_mesh((2, 1, 1), jax.devices()[:2]))
    assert calls == [(8, False)]
    np.testing.assert_array_equal(two.tokens, one.tokens)


@pytest.mark.slow  # compiles the scanned and the unrolled sampler
def test_scanned_layers_sample_the_same_tokens(model, monkeypatch):
    """A scan_layers copy of the model (stacked [B, L, ...] KV cache) samples the same tokens
    with the same keys, through chunked prefill, segment ids, growing decode phases and a
    donated cache."""
    scanned = convert_layout(model, scan_layers=True)
    cfg = SamplingConfig(max_new_tokens=12, temperature=0.9, top_k=20, stop_ids=(3,))
    tokens, mask = _batch()
    segment_ids = jnp.asarray([0, 2, 2, 1, 3, 3, 0, 2], jnp.int32)
    key = jax.random.key(7)
    monkeypatch.setattr(sampling, "_DECODE_PHASE_STEPS", 3)  # 3 phases
    monkeypatch.setattr(sampling, "_PREFILL_CHUNK_TOKENS", WIDTH)  # one prompt per chunk
    sampling._generate_jit.clear_cache()  # the constants are read while tracing
    try:
        want = generate(model, tokens, mask, key, cfg, segment_ids=segment_ids)
        got = generate(scanned, tokens, mask, key, cfg, segment_ids=segment_ids)
        cache = init_cache(scanned.cfg, 8, sampling.cache_length(WIDTH, cfg))
        assert cache.stacked
        donated, new_cache = generate_with_cache(scanned, tokens, mask, key, cfg, cache,
                                                 segment_ids=segment_ids)
    finally:
        sampling._generate_jit.clear_cache()  # drop the programs traced with patched constants
    assert cache.k.is_deleted() and cache.v.is_deleted()
    assert new_cache.stacked and new_cache.k.shape == cache.k.shape
    assert int(np.max(want.lengths)) > 6  # the later phases did sample tokens
    for out in (got, donated):
        np.testing.assert_array_equal(out.tokens, want.tokens)
        np.testing.assert_array_equal(out.lengths, want.lengths)
        np.testing.assert_allclose(out.logprobs, want.logprobs, atol=1e-5)
        np.testing.assert_allclose(out.sampling_logprobs, want.sampling_logprobs, atol=1e-5)


# ------------------------------------------------------------------------ bad arguments


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(max_new_tokens=0), "max_new_tokens=0"),
        (dict(max_new_tokens=4, temperature=0.0), "temperature=0.0"),
        (dict(max_new_tokens=4, top_p=0.0), "top_p=0.0"),
        (dict(max_new_tokens=4, top_p=1.5), "top_p=1.5"),
        (dict(max_new_tokens=4, top_k=-1), "top_k=-1"),
        (dict(max_new_tokens=4, token_draw="gumbel"), "token_draw='gumbel'"),
    ],
)
def test_config_validation(kwargs, match):
    with pytest.raises(ValueError, match=match):
        SamplingConfig(**kwargs)


def test_generate_rejects_bad_prompts(model):
    tokens, mask = _batch()
    cfg = SamplingConfig(max_new_tokens=2, greedy=True)
    with pytest.raises(ValueError, match="no real token"):
        generate(model, tokens, mask.at[0].set(False), None, cfg)
    with pytest.raises(ValueError, match="not left-padded"):
        generate(model, tokens, mask.at[0, -1].set(False), None, cfg)
    with pytest.raises(ValueError, match="outside"):
        generate(model, tokens, mask, None, SamplingConfig(2, greedy=True, stop_ids=(VOCAB,)))
    with pytest.raises(ValueError, match="key=None"):
        generate(model, tokens, mask, None, SamplingConfig(2))
