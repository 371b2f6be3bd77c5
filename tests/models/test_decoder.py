"""Decoder: config validation, KV-cache decode == full forward (left padding), RoPE
relativity, token_logprobs, sharding metadata, batch sharding constraint under a mesh."""

import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec

from sera_jax import sharding
from sera_jax.models import attention as attention_lib
from sera_jax.models import configs
from sera_jax.models import decoder as decoder_lib
from sera_jax.models.attention import constrain_batch, map_row_chunks
from sera_jax.models.decoder import (
    LOGICAL_AXIS_NAMES,
    Decoder,
    DecoderConfig,
    count_params,
    init_cache,
    positions_from_mask,
)
from sera_jax.models.logprobs import shared_prefix_logprobs, token_logprobs

TINY = DecoderConfig(vocab_size=37, hidden_size=32, intermediate_size=48, num_layers=2,
                     num_heads=4, num_kv_heads=2, rope_theta=1e4)
VARIANTS = {
    "llama_tied": TINY,
    "qwen2_untied": TINY.replace(qkv_bias=True, tie_embeddings=False),
    "qwen3": TINY.replace(qk_norm=True, head_dim=12),
}


def _randomised(cfg, seed=0):
    """A model whose norm scales and biases are random too (init leaves them 1 / 0).

    Filled from NumPy into an abstract model: eager init would compile one kernel per shape.
    """
    model = nnx.eval_shape(lambda: Decoder(cfg, rngs=nnx.Rngs(seed)))
    state = nnx.state(model, nnx.Param)
    rng = np.random.default_rng(seed)

    def fill(path, x):
        base = 1.0 if "scale" in jax.tree_util.keystr(path) else 0.0  # RMSNorm scales around 1
        return jnp.asarray(base + 0.2 * rng.standard_normal(x.shape), x.dtype)

    nnx.update(model, jax.tree.map_with_path(fill, state))
    return model


# One jitted forward for all tests (eager mode would compile every primitive separately).
_forward = nnx.jit(lambda m, t, p, a: m(t, p, attention_mask=a)[0])


def forward(model, tokens, positions, mask=None):
    return _forward(model, tokens, positions, jnp.ones(tokens.shape, bool) if mask is None
                    else mask)


def _left_padded_batch(vocab, lengths, width, seed=0):
    rng = np.random.default_rng(seed)
    tokens = np.zeros((len(lengths), width), np.int32)
    mask = np.zeros((len(lengths), width), bool)
    for i, n in enumerate(lengths):
        tokens[i, width - n:] = rng.integers(0, vocab, n)
        mask[i, width - n:] = True
    return jnp.asarray(tokens), jnp.asarray(mask)


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_cache_decode_matches_full_forward_left_padded(name):
    cfg = VARIANTS[name]
    model = _randomised(cfg)
    width, prefill = 9, 5
    tokens, mask = _left_padded_batch(cfg.vocab_size, [9, 6, 3], width)
    positions = positions_from_mask(mask)
    full = forward(model, tokens, positions, mask)
    assert full.dtype == jnp.float32

    step = nnx.jit(lambda m, t, p, c, a: m(t, p, c, a))
    cache = init_cache(cfg, batch=3, max_len=12)
    logits, cache = step(model, tokens[:, :prefill], positions[:, :prefill], cache,
                         mask[:, :prefill])
    pieces = [logits]
    for i in range(prefill, width):  # one token at a time, as the sampler decodes
        logits, cache = step(model, tokens[:, i:i + 1], positions[:, i:i + 1], cache,
                             mask[:, i:i + 1])
        pieces.append(logits)
    incremental = jnp.concatenate(pieces, axis=1)
    assert int(cache.index) == width
    np.testing.assert_array_equal(np.asarray(cache.valid[:, :width]), np.asarray(mask))
    assert not np.asarray(cache.valid[:, width:]).any()
    real = np.asarray(mask)
    np.testing.assert_allclose(np.asarray(incremental)[real], np.asarray(full)[real],
                               atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize("name", ["qwen2_untied", "qwen3"])
def test_dot_product_attention_matches_plain(name):
    """attention_impl="dot_product" (jax.nn.dot_product_attention; XLA's path on a CPU) gives
    the plain kernels' logits and gradients on real tokens: float32 within 2e-5 abs / 1e-5
    rel, the cached decode that follows its prefill included."""
    cfg = VARIANTS[name]
    plain, fused = _randomised(cfg), _randomised(cfg.replace(attention_impl="dot_product"))
    tokens, mask = _left_padded_batch(cfg.vocab_size, [9, 6, 3], 9, seed=5)
    positions = positions_from_mask(mask)
    real = np.asarray(mask)
    a, b = forward(plain, tokens, positions, mask), forward(fused, tokens, positions, mask)
    np.testing.assert_allclose(np.asarray(b)[real], np.asarray(a)[real], atol=2e-5, rtol=1e-5)

    def loss(m):
        logits = m(tokens, positions, attention_mask=mask)[0]
        return jnp.sum(jnp.where(mask[..., None], jax.nn.log_softmax(logits), 0.0)[..., 0])

    grads = [nnx.jit(nnx.grad(loss))(m) for m in (plain, fused)]
    for ga, gb in zip(jax.tree.leaves(grads[0]), jax.tree.leaves(grads[1])):
        np.testing.assert_allclose(np.asarray(gb), np.asarray(ga), atol=2e-5, rtol=1e-4)

    step = nnx.jit(lambda m, t, p, c, a: m(t, p, c, a))
    outs = []
    for m in (plain, fused):  # prefill (the fused path) then one cached decode step
        cache = init_cache(m.cfg, batch=3, max_len=12)
        _, cache = step(m, tokens[:, :8], positions[:, :8], cache, mask[:, :8])
        outs.append(step(m, tokens[:, 8:], positions[:, 8:], cache, mask[:, 8:])[0])
    np.testing.assert_allclose(np.asarray(outs[1]), np.asarray(outs[0]), atol=2e-5, rtol=1e-5)


def test_left_padding_does_not_change_real_rows():
    model = _randomised(VARIANTS["qwen2_untied"])
    tokens, mask = _left_padded_batch(TINY.vocab_size, [8, 4], 8, seed=3)
    padded = forward(model, tokens, positions_from_mask(mask), mask)
    alone = forward(model, tokens[1:, 4:], jnp.arange(4)[None])
    np.testing.assert_allclose(np.asarray(padded[1, 4:]), np.asarray(alone[0]), atol=1e-5)
    assert np.isfinite(np.asarray(padded)).all()  # fully-masked pad queries stay finite


def test_rope_depends_only_on_relative_position():
    model = _randomised(VARIANTS["qwen3"])
    tokens = jnp.asarray(np.random.default_rng(1).integers(0, 37, (1, 7)), jnp.int32)
    base = forward(model, tokens, jnp.arange(7)[None])
    shifted = forward(model, tokens, jnp.arange(7)[None] + 40)
    np.testing.assert_allclose(np.asarray(base), np.asarray(shifted), atol=5e-5)
    # ... and positions do matter: a permuted position vector changes the logits.
    scrambled = forward(model, tokens, jnp.asarray([[0, 2, 1, 3, 4, 6, 5]]))
    assert np.abs(np.asarray(base - scrambled)).max() > 1e-3


def test_token_logprobs_matches_log_softmax():
    model = _randomised(TINY)
    tokens, mask = _left_padded_batch(TINY.vocab_size, [6, 3], 6, seed=5)
    lp = np.asarray(nnx.jit(token_logprobs)(model, tokens, mask))
    logits = forward(model, tokens, positions_from_mask(mask), mask)
    logp = np.asarray(jax.nn.log_softmax(logits, axis=-1))
    tok = np.asarray(tokens)
    for b in range(2):
        for t in range(1, 6):
            want = logp[b, t - 1, tok[b, t]] if mask[b, t] else 0.0
            assert lp[b, t] == pytest.approx(want, abs=1e-5)
    assert (lp[:, 0] == 0).all() and (lp[1, :3] == 0).all()
    assert (lp[np.asarray(mask)][1:] < 0).all()


def test_bfloat16_compute_returns_float32_logits_close_to_float32():
    model = _randomised(TINY)
    bf16 = _randomised(TINY.replace(dtype=jnp.bfloat16))  # same seed: same float32 params
    tokens = jnp.arange(6)[None]
    a = forward(model, tokens, jnp.arange(6)[None])
    b = forward(bf16, tokens, jnp.arange(6)[None])
    assert b.dtype == jnp.float32
    assert np.abs(np.asarray(a - b)).max() < 0.1 * np.abs(np.asarray(a)).max()


def test_every_param_has_logical_axis_names():
    scanned = [c.replace(scan_layers=True) for c in VARIANTS.values()]
    for cfg in (*VARIANTS.values(), *scanned):
        model = nnx.eval_shape(lambda cfg=cfg: Decoder(cfg, rngs=nnx.Rngs(0)))
        for path, var in nnx.to_flat_state(nnx.state(model, nnx.Param)):
            names = var.get_metadata()["out_sharding"]
            assert len(names) == var.get_value().ndim, path
            assert set(names) <= set(LOGICAL_AXIS_NAMES), path
            # Stacked layer params (and only they) lead with the unsplit "layers" axis.
            assert (names[0] == "layers") == (cfg.scan_layers and path[0] == "layers"), path


def _param_count(cfg):
    """Parameter count from the architecture fields (independent of the module code)."""
    d, f, h, hkv, dh = (cfg.hidden_size, cfg.intermediate_size, cfg.num_heads,
                        cfg.num_kv_heads, cfg.resolved_head_dim)
    attn = d * h * dh * 2 + d * hkv * dh * 2
    attn += (h + 2 * hkv) * dh * cfg.qkv_bias + 2 * dh * cfg.qk_norm
    per_layer = attn + 3 * d * f + 2 * d
    embed = cfg.vocab_size * d * (1 if cfg.tie_embeddings else 2)
    return cfg.num_layers * per_layer + embed + d


def test_named_config_sizes():
    # Published sizes: SmolLM2 134.5M / 361.8M, Qwen2.5-Math-1.5B 1.54B, Qwen3-4B 4.02B.
    assert abs(_param_count(configs.SMOLLM2_135M) - 134.5e6) < 0.5e6
    assert abs(_param_count(configs.SMOLLM2_360M) - 361.8e6) < 1e6
    assert abs(_param_count(configs.QWEN25_MATH_1_5B) - 1.54e9) < 0.01e9
    assert abs(_param_count(configs.QWEN3_4B) - 4.02e9) < 0.01e9
    for cfg in (configs.SMOLLM2_135M, *VARIANTS.values()):  # the module agrees with it
        model = nnx.eval_shape(lambda cfg=cfg: Decoder(cfg, rngs=nnx.Rngs(0)))
        assert count_params(model) == _param_count(cfg)
    maze = configs.get_config("maze_policy")
    assert (maze.num_layers, maze.hidden_size, maze.intermediate_size, maze.num_heads,
            maze.num_kv_heads, maze.vocab_size, maze.rope_theta, maze.tie_embeddings) == (
        4, 256, 1024, 4, 2, 32, 1e6, True)


@pytest.mark.parametrize("field,value,match", [
    ("num_kv_heads", 3, "multiple of"),
    ("hidden_size", 30, "not divisible"),
    ("num_layers", 0, "num_layers"),
    ("rope_theta", -1.0, "rope_theta"),
    ("attention_impl", "flash", "attention_impl"),
])
def test_config_validation(field, value, match):
    with pytest.raises(ValueError, match=match):
        TINY.replace(**{field: value})


def test_get_config_unknown_name():
    with pytest.raises(ValueError, match="unknown decoder config"):
        configs.get_config("gpt5")


def test_init_cache_validation_and_shape():
    cache = init_cache(TINY, batch=2, max_len=5)
    # One buffer per layer (TINY: 2 layers, 2 KV heads, head_dim 8): keys [B, Hkv, Dh, S],
    # values [B, Hkv, S, Dh].
    assert len(cache.k) == len(cache.v) == TINY.num_layers
    assert all(a.shape == (2, 2, 8, 5) for a in cache.k)
    assert all(a.shape == (2, 2, 5, 8) for a in cache.v)
    assert cache.valid.shape == (2, 5) and cache.max_len == 5
    with pytest.raises(ValueError, match="max_len"):
        init_cache(TINY, batch=2, max_len=0)


def test_call_shape_validation():
    model = _randomised(TINY)
    tokens = jnp.zeros((2, 3), jnp.int32)
    with pytest.raises(ValueError, match="positions"):
        model(tokens, jnp.zeros((2, 4), jnp.int32))
    with pytest.raises(ValueError, match="attention_mask"):
        model(tokens, tokens, attention_mask=jnp.ones((2, 4), bool))
    with pytest.raises(ValueError, match="batch must match"):
        model(tokens, tokens, init_cache(TINY, batch=3, max_len=8))
    with pytest.raises(ValueError, match="num_layers=2"):
        model(tokens, tokens, init_cache(TINY.replace(num_layers=3), batch=2, max_len=8))


def test_constrain_batch_is_noop_without_mesh_and_splits_rows_under_one():
    x = jnp.zeros((8, 3, 32))
    assert constrain_batch(x) is x  # no mesh context: untouched
    mesh = sharding.make_mesh((2, 2, 2))
    with jax.set_mesh(mesh):
        y = jax.jit(constrain_batch)(x)
        assert y.sharding.is_equivalent_to(NamedSharding(mesh, PartitionSpec(("data", "fsdp"))), 3)
        # 6 rows do not divide by data*fsdp = 4: keep the dividing prefix ('data').
        z = jax.jit(constrain_batch)(jnp.zeros((6, 3, 32)))
        assert z.sharding.is_equivalent_to(NamedSharding(mesh, PartitionSpec("data")), 3)


def test_forward_under_mesh_matches_single_device():
    model = _randomised(TINY)
    tokens, mask = _left_padded_batch(TINY.vocab_size, [6, 3, 5, 6], 6, seed=1)
    positions = positions_from_mask(mask)
    ref = np.asarray(forward(model, tokens, positions, mask))
    mesh = sharding.make_mesh((2, 2, 2))
    sharded = sharding.shard_model(_randomised(TINY), mesh)
    with jax.set_mesh(mesh):
        out = forward(sharded, *sharding.shard_batch((tokens, positions, mask), mesh))
    np.testing.assert_allclose(np.asarray(out), ref, atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_last_only_prefill_matches_full_forward(name):
    """`last_only=True` (the last layer runs its attention output and MLP for the last token
    only) gives the full forward's last-position logits and the same KV cache, with and
    without a cache."""
    cfg = VARIANTS[name]
    model = _randomised(cfg)
    tokens, mask = _left_padded_batch(cfg.vocab_size, [6, 3, 5], 6, seed=2)
    positions = positions_from_mask(mask)
    run = nnx.jit(lambda m, t, p, a, c: m(t, p, cache=c, attention_mask=a),)
    run_last = nnx.jit(lambda m, t, p, a, c: m(t, p, cache=c, attention_mask=a, last_only=True))
    full, full_cache = run(model, tokens, positions, mask, init_cache(cfg, 3, 6))
    last, last_cache = run_last(model, tokens, positions, mask, init_cache(cfg, 3, 6))
    assert last.shape == (3, 1, cfg.vocab_size)
    np.testing.assert_allclose(last[:, 0], full[:, -1], atol=2e-5, rtol=1e-5)
    for got, want in zip(jax.tree.leaves(last_cache), jax.tree.leaves(full_cache)):
        np.testing.assert_allclose(got, want, atol=1e-6)
    no_cache, _ = run_last(model, tokens, positions, mask, None)
    np.testing.assert_allclose(no_cache[:, 0], full[:, -1], atol=2e-5, rtol=1e-5)


def test_map_row_chunks_takes_the_same_rows_of_every_shard():
    x = jnp.arange(24 * 3, dtype=jnp.float32).reshape(24, 3)
    seen = []

    def fn(args):
        (rows,) = args
        seen.append(rows.shape[0])
        return rows * jnp.sum(rows, axis=1, keepdims=True), rows[:, :1]

    want = (x * jnp.sum(x, axis=1, keepdims=True), x[:, :1])
    # Largest divisor r of 24 with r * 5 <= 22: 4 rows per step, 6 steps.
    got = map_row_chunks(fn, (x,), row_cost=5, budget=22)
    assert seen == [4]
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)
    assert map_row_chunks(fn, (x,), row_cost=100, budget=1) is not None and seen[-1] == 1
    mesh = sharding.make_mesh((2, 2, 2))  # 4 batch shards of 6 rows: 2 rows of each per step
    with jax.set_mesh(mesh):
        got = jax.jit(lambda x: map_row_chunks(fn, (x,), row_cost=5, budget=10))(
            jax.device_put(x, sharding.batch_sharding(mesh, 2)))
    assert seen[-1] == 8
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)
        assert g.sharding.is_equivalent_to(sharding.batch_sharding(mesh, 2), 2)


def test_row_chunked_attention_matches_whole_batch(monkeypatch):
    """The causal attention processed one row per map step (unsharded, and one row of each
    batch shard per step under a mesh) equals the whole-batch computation."""
    model = _randomised(TINY)
    tokens, mask = _left_padded_batch(TINY.vocab_size, [7, 3, 5, 7, 1, 6, 7, 2], 7, seed=3)
    positions = positions_from_mask(mask)
    fwd = nnx.jit(lambda m, t, p, a: m(t, p, attention_mask=a)[0])
    want = np.asarray(fwd(model, tokens, positions, mask))
    monkeypatch.setattr(attention_lib, "_SCORE_BLOCK_BYTES", 1)  # one row per step
    got = np.asarray(nnx.jit(lambda m, t, p, a: m(t, p, attention_mask=a)[0])(
        model, tokens, positions, mask))
    np.testing.assert_allclose(got, want, atol=2e-6, rtol=1e-6)
    mesh = sharding.make_mesh((2, 2, 2))
    sharded = sharding.shard_model(_randomised(TINY), mesh)
    with jax.set_mesh(mesh):
        got = nnx.jit(lambda m, t, p, a: m(t, p, attention_mask=a)[0])(
            sharded, *sharding.shard_batch((tokens, positions, mask), mesh))
    np.testing.assert_allclose(np.asarray(got), want, atol=2e-5, rtol=1e-5)


_REMAT_SCRIPT = """
import sys
import jax
from flax import nnx
from sera_jax import sharding
from sera_jax.models.decoder import Decoder, DecoderConfig
from sera_jax.models.logprobs import token_logprobs

cfg = DecoderConfig(vocab_size=37, hidden_size=32, intermediate_size=48, num_layers=2,
                    num_heads=4, num_kv_heads=2)
mesh = sharding.make_mesh((2, 2, 2))
graphdef, params = nnx.split(sharding.shard_model(Decoder(cfg, rngs=nnx.Rngs(0)), mesh))
tokens = jax.numpy.arange(32, dtype=jax.numpy.int32).reshape(4, 8) % 37
tokens, mask = sharding.shard_batch((tokens, tokens >= 0), mesh)

def loss(p, t, m):
    return -token_logprobs(nnx.merge(graphdef, p), t, m).mean()

for context in ("mesh", "none"):
    print(f"== {context}", file=sys.stderr, flush=True)
    if context == "mesh":
        with jax.set_mesh(mesh):
            jax.jit(jax.grad(loss)).lower(params, tokens, mask).compile()
    else:
        jax.jit(jax.grad(loss)).lower(params, tokens, mask).compile()
print("== end", file=sys.stderr, flush=True)
"""


def test_activation_constraint_avoids_full_rematerialisation():
    # data=2, fsdp=2, tensor=2: the trainer's layout. XLA's warning is C++ logging, which
    # the test session silences (TF_CPP_MIN_LOG_LEVEL=3), hence a subprocess. The mesh case
    # compiles first, so a rate-limited log cannot hide its warning; the no-mesh case
    # (constraints off) is the control that must warn.
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="0", JAX_PLATFORMS="cpu")
    run = subprocess.run([sys.executable, "-c", _REMAT_SCRIPT], env=env, capture_output=True,
                         text=True, timeout=300, check=True)
    log = run.stderr
    with_mesh = log[log.index("== mesh"):log.index("== none")]
    without = log[log.index("== none"):log.index("== end")]
    assert "Involuntary full rematerialization" not in with_mesh
    assert "Involuntary full rematerialization" in without


# ------------------------------------------------------------ scanned layers (scan_layers)

# Every parameter kind at once (bias, q/k norm, untied head), 3 layers; and the 1-layer edge
# case (a `last_only` pass scans no layer before the last). Few variants: each compiles.
SCAN_VARIANTS = {
    "all_params": TINY.replace(num_layers=3, qkv_bias=True, qk_norm=True, head_dim=12,
                               tie_embeddings=False),
    "one_layer": TINY.replace(num_layers=1),
}


def _stacked(flat_unrolled, num_layers):
    """{path: array} of an unrolled model's state, restated in the scanned layout by hand:
    `("layers", i, *rest)` -> `("layers", *rest)` stacked over i (independent of
    `convert_layout`)."""
    out = {}
    for path, x in flat_unrolled.items():
        if path[0] != "layers":
            out[path] = np.asarray(x)
    rests = {path[2:] for path in flat_unrolled if path[0] == "layers"}
    for rest in rests:
        out[("layers", *rest)] = np.stack(
            [np.asarray(flat_unrolled[("layers", i, *rest)]) for i in range(num_layers)])
    return out


def _flat(state):
    return {path: var.get_value() if isinstance(var, nnx.Variable) else var
            for path, var in nnx.to_flat_state(state)}


def test_scanned_init_is_the_stacked_unrolled_init_and_converts_back():
    cfg = SCAN_VARIANTS["all_params"]
    unrolled = Decoder(cfg, rngs=nnx.Rngs(3))
    scanned = Decoder(cfg.replace(scan_layers=True), rngs=nnx.Rngs(3))
    assert isinstance(unrolled.layers, nnx.List) and not isinstance(scanned.layers, nnx.List)
    want = _stacked(_flat(nnx.state(unrolled)), cfg.num_layers)
    got = _flat(nnx.state(scanned))
    assert got.keys() == want.keys()
    for path in want:
        np.testing.assert_array_equal(got[path], want[path], err_msg=str(path))
    assert scanned.layers.attn.q_kernel.get_metadata()["out_sharding"] == (
        "layers", "embed", "q_heads", "head_dim")
    assert count_params(scanned) == count_params(unrolled)
    converted = decoder_lib.convert_layout(unrolled, scan_layers=True)
    assert converted.cfg.scan_layers
    for path, x in _flat(nnx.state(converted)).items():
        np.testing.assert_array_equal(x, want[path])
    back = decoder_lib.convert_layout(scanned, scan_layers=False)
    assert not back.cfg.scan_layers
    for path, x in _flat(nnx.state(unrolled)).items():
        np.testing.assert_array_equal(_flat(nnx.state(back))[path], x)
    assert decoder_lib.convert_layout(scanned, scan_layers=True) is scanned


@pytest.mark.parametrize("name", sorted(SCAN_VARIANTS))
def test_scanned_matches_unrolled_prefill_and_cached_decode(name):
    """Same weights, both layouts: full forward, a cached prefill (plain and `last_only`),
    then one-token decode steps give the same logits and the same cache contents."""
    cfg = SCAN_VARIANTS[name]
    unrolled = _randomised(cfg, seed=4)
    scanned = decoder_lib.convert_layout(unrolled, scan_layers=True)
    tokens, mask = _left_padded_batch(cfg.vocab_size, [9, 6, 3], 9, seed=4)
    positions = positions_from_mask(mask)
    np.testing.assert_allclose(forward(scanned, tokens, positions, mask),
                               forward(unrolled, tokens, positions, mask), atol=2e-5, rtol=1e-5)

    step = nnx.jit(lambda m, t, p, c, a: m(t, p, c, a))
    prefill_last = nnx.jit(lambda m, t, p, c, a: m(t, p, c, a, last_only=True))

    def same_cache(c_unrolled, c_scanned):
        assert c_scanned.stacked and not c_unrolled.stacked
        np.testing.assert_allclose(c_scanned.k, np.stack(c_unrolled.k, axis=1), atol=1e-5)
        np.testing.assert_allclose(c_scanned.v, np.stack(c_unrolled.v, axis=1), atol=1e-5)
        np.testing.assert_array_equal(c_scanned.valid, c_unrolled.valid)
        assert int(c_scanned.index) == int(c_unrolled.index)

    # A prompt filling a fresh cache (T = S: each layer's buffer replaced whole), then a
    # last_only prefill into a longer one (slots written at `index`), decoded on from.
    prefill = 5
    for run, slots in ((step, prefill), (prefill_last, 12)):
        pair = []
        for model in (unrolled, scanned):
            pair.append(run(model, tokens[:, :prefill], positions[:, :prefill],
                            init_cache(model.cfg, batch=3, max_len=slots), mask[:, :prefill]))
        (l_u, c_u), (l_s, c_s) = pair
        np.testing.assert_allclose(l_s, l_u, atol=2e-5, rtol=1e-5)
        same_cache(c_u, c_s)
    for i in range(prefill, 9):
        args = (tokens[:, i:i + 1], positions[:, i:i + 1])
        l_u, c_u = step(unrolled, *args, c_u, mask[:, i:i + 1])
        l_s, c_s = step(scanned, *args, c_s, mask[:, i:i + 1])
        np.testing.assert_allclose(l_s, l_u, atol=2e-5, rtol=1e-5)
    same_cache(c_u, c_s)
    # last_only without a cache as well.
    no_cache = nnx.jit(lambda m, t, p, a: m(t, p, attention_mask=a, last_only=True)[0])
    np.testing.assert_allclose(no_cache(scanned, tokens, positions, mask),
                               no_cache(unrolled, tokens, positions, mask), atol=2e-5, rtol=1e-5)


def _weighted_logprob_loss(model, tokens, mask, weights):
    return -jnp.sum(token_logprobs(model, tokens, mask) * weights)


_loss_grad = nnx.jit(nnx.value_and_grad(_weighted_logprob_loss))


def test_scanned_gradients_match_unrolled():
    cfg = SCAN_VARIANTS["all_params"]
    unrolled = _randomised(cfg, seed=5)
    scanned = decoder_lib.convert_layout(unrolled, scan_layers=True)
    tokens, mask = _left_padded_batch(cfg.vocab_size, [7, 4, 6], 7, seed=5)
    weights = jnp.asarray(np.random.default_rng(5).standard_normal(tokens.shape), jnp.float32)
    loss_u, g_u = _loss_grad(unrolled, tokens, mask, weights)
    loss_s, g_s = _loss_grad(scanned, tokens, mask, weights)
    np.testing.assert_allclose(loss_s, loss_u, rtol=1e-5)
    want = _stacked(_flat(g_u), cfg.num_layers)
    got = _flat(g_s)
    assert got.keys() == want.keys()
    for path in want:
        assert np.abs(want[path]).max() > 0, path  # every parameter gets a gradient
        np.testing.assert_allclose(got[path], want[path], atol=1e-5, rtol=1e-4,
                                   err_msg=str(path))


def test_scanned_program_holds_one_block():
    """The scanned forward's program does not grow with depth (the unrolled one does)."""
    def dots(cfg):
        model = nnx.eval_shape(lambda: Decoder(cfg, rngs=nnx.Rngs(0)))
        graphdef, state = nnx.split(model)
        tokens = jax.ShapeDtypeStruct((2, 6), jnp.int32)
        text = jax.jit(lambda s, t: nnx.merge(graphdef, s)(t, t)[0]).lower(
            state, tokens).as_text()
        return text.count("dot_general")

    scanned = TINY.replace(scan_layers=True)
    assert dots(scanned.replace(num_layers=2)) == dots(scanned.replace(num_layers=5))
    assert dots(TINY.replace(num_layers=5)) > dots(TINY.replace(num_layers=2))


def test_scanned_cache_layout_and_validation():
    cfg = TINY.replace(scan_layers=True)
    cache = init_cache(cfg, batch=2, max_len=5, dtype=jnp.bfloat16)
    assert cache.stacked and cache.k.shape == (2, 2, 2, 8, 5) and cache.v.shape == (2, 2, 2, 5, 8)
    assert cache.k.dtype == jnp.bfloat16 and cache.valid.shape == (2, 5)
    assert init_cache(cfg, batch=2, max_len=5).k.dtype == jnp.float32
    assert not init_cache(TINY, batch=2, max_len=5).stacked
    tokens = jnp.zeros((2, 3), jnp.int32)
    scanned = _randomised(cfg)
    with pytest.raises(ValueError, match="scan_layers=True"):
        scanned(tokens, tokens, init_cache(TINY, batch=2, max_len=8))
    with pytest.raises(ValueError, match="num_layers=2"):
        scanned(tokens, tokens, init_cache(cfg.replace(num_layers=3), batch=2, max_len=8))
    with pytest.raises(ValueError, match="scan_layers=False"):
        _randomised(TINY)(tokens, tokens, init_cache(cfg, batch=2, max_len=8))


def test_scanned_under_mesh_matches_single_device():
    """Stacked params shard like their per-layer selves with the layer axis unsplit; the
    sharded forward and gradient equal the single-device ones."""
    cfg = TINY.replace(scan_layers=True)
    tokens, mask = _left_padded_batch(cfg.vocab_size, [6, 3, 5, 6], 6, seed=6)
    weights = jnp.asarray(np.random.default_rng(6).standard_normal(tokens.shape), jnp.float32)
    ref_loss, ref_grads = _loss_grad(_randomised(cfg), tokens, mask, weights)
    mesh = sharding.make_mesh((2, 2, 2))
    sharded = sharding.shard_model(_randomised(cfg), mesh)
    assert sharded.layers.attn.q_kernel[...].sharding.spec == PartitionSpec(
        None, "fsdp", "tensor", None)
    assert sharded.layers.mlp.down[...].sharding.spec == PartitionSpec(None, "tensor", "fsdp")
    tokens, mask = sharding.shard_batch((tokens, mask), mesh)
    with jax.set_mesh(mesh):
        loss, grads = _loss_grad(sharded, tokens, mask, weights)
    np.testing.assert_allclose(loss, ref_loss, rtol=1e-5)
    assert not grads["layers"]["attn"]["q_kernel"].get_value().sharding.is_fully_replicated
    for path, g in _flat(ref_grads).items():
        np.testing.assert_allclose(np.asarray(_flat(grads)[path]), g, atol=1e-5, rtol=1e-4)


def test_scanned_params_round_trip_through_checkpointer(tmp_path):
    """The stacked state is an ordinary pytree for `sera_jax.checkpoint` (restored onto the
    abstract target, sharded on a mesh); an unrolled checkpoint is refused for a scanned
    target, naming the paths."""
    from sera_jax.checkpoint import Checkpointer, CheckpointError

    cfg = TINY.replace(scan_layers=True)
    mesh = sharding.make_mesh((2, 2, 2))
    params = nnx.state(sharding.shard_model(_randomised(cfg), mesh), nnx.Param)
    with Checkpointer(tmp_path / "scanned") as ckpt:
        ckpt.save(1, params)
        ckpt.wait_until_finished()
        target = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype,
                                                             sharding=x.sharding), params)
        restored, _ = ckpt.restore(target)
    for path, x in _flat(params).items():
        got = _flat(restored)[path]
        np.testing.assert_array_equal(np.asarray(got), np.asarray(x))
        assert got.sharding.is_equivalent_to(x.sharding, x.ndim), path
    with Checkpointer(tmp_path / "unrolled") as ckpt:
        ckpt.save(1, nnx.state(_randomised(TINY), nnx.Param))
        ckpt.wait_until_finished()
        with pytest.raises(CheckpointError, match="layers"):
            ckpt.restore(target)


def _logprobs_and_grad(f, model, weights):
    """(f(model), ∇ Σ weights · f(model)) from ONE compiled program (not a program for the
    values and another for the gradient, nor hundreds of eager ops)."""
    def loss(m):
        lp = f(m)
        return jnp.sum(weights * lp), lp

    (_, lp), grad = nnx.jit(nnx.value_and_grad(loss, has_aux=True))(model)
    return lp, grad


def test_token_logprobs_start_matches_full_forward_reference():
    """`start=` (head only at the predicting positions, last token dropped) equals the
    straightforward full-forward log-softmax, values and gradients (float32 tolerance)."""
    cfg = DecoderConfig(vocab_size=61, hidden_size=32, intermediate_size=64, num_layers=2,
                        num_heads=4, num_kv_heads=2)
    model = Decoder(cfg, rngs=nnx.Rngs(3))
    rng = np.random.default_rng(0)
    tokens = jnp.asarray(rng.integers(0, 61, (3, 11)), jnp.int32)
    mask = jnp.asarray(np.arange(11)[None] >= np.array([[0], [2], [5]]))
    width = 6
    weights = jnp.asarray(rng.normal(size=(3, 11 - width)), jnp.float32)

    def reference(m):
        logits, _ = m(tokens, positions_from_mask(mask), attention_mask=mask)
        lp = jax.nn.log_softmax(logits[:, :-1], axis=-1)
        lp = jnp.take_along_axis(lp, tokens[:, 1:, None], axis=-1)[..., 0]
        return jnp.where(mask[:, 1:], lp, 0.0)[:, width - 1:]

    def fast(m):
        return token_logprobs(m, tokens, mask, start=width)

    (lp_fast, g_fast), (lp_ref, g_ref) = (_logprobs_and_grad(f, model, weights)
                                          for f in (fast, reference))
    np.testing.assert_allclose(lp_fast, lp_ref, atol=1e-5)
    whole = nnx.jit(lambda m: token_logprobs(m, tokens, mask))(model)
    np.testing.assert_allclose(whole[:, width:], lp_ref, atol=1e-5)
    for a, b in zip(jax.tree.leaves(g_fast), jax.tree.leaves(g_ref), strict=True):
        np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("variant", ["llama_tied", "qwen2_untied", "qwen3", "scan"])
def test_shared_prefix_logprobs_equal_the_per_row_forward(variant):
    """Each prompt's forward once, its rows' completions against its cache: the same
    completion log-probs and gradients as one prompt + completion forward per row (left-
    padded prompts of different lengths, ragged completions, rows in any prompt order)."""
    cfg = TINY.replace(scan_layers=True) if variant == "scan" else VARIANTS[variant]
    model = _randomised(cfg, seed=4)
    rng = np.random.default_rng(1)
    s, w, r, t = 3, 7, 8, 5
    prompts = rng.integers(0, cfg.vocab_size, (s, w))
    prompt_mask = np.arange(w)[None] >= np.array([[0], [3], [5]])  # 7, 4 and 2 real tokens
    row_prompt = np.array([0, 0, 2, 1, 2, 2, 1, 0])
    completions = rng.integers(0, cfg.vocab_size, (r, t))
    completion_mask = np.arange(t)[None] < rng.integers(1, t + 1, (r, 1))
    weights = jnp.asarray(rng.normal(size=(r, t)), jnp.float32)
    tokens = jnp.asarray(np.concatenate([prompts[row_prompt], completions], 1))
    mask = jnp.asarray(np.concatenate([prompt_mask[row_prompt], completion_mask], 1))

    def shared(m):
        return shared_prefix_logprobs(m, *(jnp.asarray(x) for x in (
            prompts, prompt_mask, row_prompt, completions, completion_mask)))

    def per_row(m):
        return token_logprobs(m, tokens, mask, start=w)

    (got, grad_shared), (want, grad_per_row) = (_logprobs_and_grad(f, model, weights)
                                                for f in (shared, per_row))
    assert got.shape == (r, t) and not np.asarray(got)[~completion_mask].any()
    np.testing.assert_allclose(got, want, atol=1e-5)
    for a, b in zip(jax.tree.leaves(grad_shared), jax.tree.leaves(grad_per_row), strict=True):
        np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-4)
    one = nnx.jit(shared_prefix_logprobs)(  # T = 1: the prompts' forward alone
        model, jnp.asarray(prompts), jnp.asarray(prompt_mask), jnp.asarray(row_prompt),
        jnp.asarray(completions[:, :1]), jnp.asarray(completion_mask[:, :1]))
    np.testing.assert_allclose(one, want[:, :1], atol=1e-5)


def test_bf16_attention_rounds_probabilities_like_the_bf16_program():
    """bf16 q/k/v: the probabilities are rounded to bf16 before the value product (what the
    bf16 program does on an accelerator), also on CPU, where the operands are upcast."""
    rng = np.random.default_rng(0)
    b, t, hkv, g, dh, s = 2, 3, 1, 2, 8, 5
    q, k, v = (jnp.asarray(rng.normal(size=shape), jnp.bfloat16) for shape in
               ((b, t, hkv, g, dh), (b, hkv, dh, s), (b, hkv, s, dh)))
    mask = jnp.ones((b, t, s), bool)
    got = np.asarray(attention_lib.attend(q, k, v, mask))
    q32, k32, v32 = (np.asarray(x, np.float32) for x in (q, k, v))
    scores = np.einsum("btkgd,bkds->bkgts", q32, k32)
    weights = np.exp(scores - scores.max(-1, keepdims=True))
    total = np.transpose(weights.sum(-1), (0, 3, 1, 2))[..., None]

    def out(w):
        return np.einsum("bkgts,bksd->btkgd", w, v32) / total

    rounded = np.asarray(jnp.asarray(weights, jnp.bfloat16), np.float32)
    np.testing.assert_allclose(got, out(rounded), rtol=1e-5, atol=1e-6)
    assert np.abs(got - out(weights)).max() > 1e-4  # the rounding is visible
