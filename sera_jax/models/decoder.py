"""Qwen2 / Llama-family decoder-only transformer in Flax NNX, with a fixed-size KV cache.

One block (pre-norm, as in Hugging Face `LlamaDecoderLayer` / `Qwen2DecoderLayer`):

    h = x + o_proj(attn(rope(q_norm(q_proj(n1(x)))), rope(k_norm(k_proj(n1(x)))), v_proj(n1(x))))
    y = h + down(silu(gate(n2(h))) * up(n2(h)))

with RMSNorm `n(x) = w * x / sqrt(mean(x^2) + eps)` (computed in float32), grouped-query
attention (`num_heads` query heads share `num_kv_heads` key/value heads), RoPE in the Hugging
Face "rotate_half" layout (`x * cos + rotate_half(x) * sin`, frequencies
`theta^(-2i/head_dim)` repeated over both halves), optional q/k/v bias (Qwen2) and optional
per-head q/k RMSNorm (Qwen3). Logits are float32.

Parameter layout (all `nnx.Param`; the `out_sharding` metadata holds *logical* axis names,
with `eager_sharding=False` so a model can be built without a mesh):

    embed                          [vocab, hidden]               ("vocab", "embed")
    lm_head (untied only)          [hidden, vocab]               ("embed", "vocab")
    final_norm.scale               [hidden]                      ("norm",)
    layers[i].attn_norm.scale      [hidden]                      ("norm",)
    layers[i].attn.q_kernel        [hidden, heads, head_dim]     ("embed", "q_heads", "head_dim")
    layers[i].attn.k_kernel / v_kernel
                                   [hidden, kv_heads, head_dim]  ("embed", "kv_heads", "head_dim")
    layers[i].attn.o_kernel        [heads, head_dim, hidden]     ("q_heads", "head_dim", "embed")
    layers[i].attn.q_bias          [heads, head_dim]             ("q_heads", "head_dim")
    layers[i].attn.k_bias / v_bias [kv_heads, head_dim]          ("kv_heads", "head_dim")
    layers[i].attn.q_norm / k_norm .scale [head_dim]             ("head_dim",)
    layers[i].mlp_norm.scale       [hidden]                      ("norm",)
    layers[i].mlp.gate / up        [hidden, ffn]                 ("embed", "mlp")
    layers[i].mlp.down             [ffn, hidden]                 ("mlp", "embed")

With `DecoderConfig.scan_layers=True` the L blocks are one `Block` whose parameters are
stacked along a leading layer axis (`layers.attn.q_kernel [L, hidden, heads, head_dim]`,
logical names `("layers", ...)`; `layers` maps to no mesh axis), run by one `lax.scan`:
the compiled program holds one block instead of L. `convert_layout` moves weights between
the two layouts; the same seed initialises the same weights in both. Trade-off measured by
`benchmarks/decoder_compile_bench.py`: on XLA:CPU a scan step copies its layer's weights
(and KV-cache slice) out of the stack, which a memory-bound decode step pays for, while
identical unrolled layers already share compiled kernels there, so the compile-time gain
is modest. (On accelerators XLA can usually fuse such a slice into its consumer; not
measured here.)

`sera_jax.sharding.state_shardings(state, mesh, rules)` maps the logical names
(`LOGICAL_AXIS_NAMES`) to mesh axes by `sharding.LOGICAL_RULES`. Under `jax.set_mesh(mesh)`
the residual stream is constrained to batch rows split over `sharding.BATCH_AXES` (hidden
dimension replicated); without a mesh context that constraint is a no-op.

The parameter-free parts (RoPE, attention kernels, cache slot helpers, sharding
constraints) are in `sera_jax.models.attention`; per-token log-probs of a forward
(`token_logprobs`, `shared_prefix_logprobs`) in `sera_jax.models.logprobs`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx, struct

from sera_jax.models.attention import (
    ATTENTION_IMPLS,
    MASK_VALUE,
    apply_rope,
    attend,
    causal_attention,
    constrain,
    constrain_batch,
    fused_causal_attention,
    layer_buffer,
    rope_tables,
    store_new_slots,
)

#: Every logical axis name used in parameter `out_sharding` metadata.
LOGICAL_AXIS_NAMES = ("vocab", "embed", "q_heads", "kv_heads", "head_dim", "mlp", "norm",
                      "layers")


@dataclasses.dataclass(frozen=True)
class DecoderConfig:
    """Architecture hyper-parameters (names follow Hugging Face `config.json` semantics)."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int | None = None  # None: hidden_size // num_heads
    rope_theta: float = 10_000.0
    rms_norm_eps: float = 1e-6
    qkv_bias: bool = False  # Qwen2: bias on q/k/v projections
    qk_norm: bool = False  # Qwen3: per-head RMSNorm on q and k before RoPE
    tie_embeddings: bool = True
    max_position_embeddings: int = 4096  # informational; RoPE has no table
    initializer_range: float = 0.02
    dtype: Any = jnp.float32  # activation / compute dtype
    param_dtype: Any = jnp.float32
    name: str = ""
    # Layers stacked on a leading axis and run by `lax.scan`: the program holds one block
    # whatever the depth (see the module docstring). False (default): one module per
    # layer, an unrolled loop -- faster steady state on XLA:CPU, where each scan step copies
    # its layer's weights out of the stack.
    scan_layers: bool = False
    # "dot_product": the causal (training / prefill) attention through
    # `jax.nn.dot_product_attention` (cuDNN flash attention on a GPU: long sequences without
    # materialised scores); "plain": this package's kernels (fastest on XLA:CPU).
    attention_impl: str = "plain"

    def __post_init__(self):
        if self.attention_impl not in ATTENTION_IMPLS:
            raise ValueError(f"DecoderConfig.attention_impl={self.attention_impl!r}; choose "
                             f"from {ATTENTION_IMPLS}")
        for field in ("vocab_size", "hidden_size", "intermediate_size", "num_layers",
                      "num_heads", "num_kv_heads"):
            value = getattr(self, field)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"DecoderConfig.{field}={value!r}; must be an int >= 1")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"DecoderConfig.num_heads={self.num_heads} must be a multiple of "
                f"num_kv_heads={self.num_kv_heads} (grouped-query attention)"
            )
        if self.head_dim is None and self.hidden_size % self.num_heads:
            raise ValueError(
                f"DecoderConfig.hidden_size={self.hidden_size} is not divisible by "
                f"num_heads={self.num_heads}; set head_dim explicitly"
            )
        if self.resolved_head_dim % 2:
            raise ValueError(f"DecoderConfig.head_dim={self.resolved_head_dim} must be even (RoPE)")
        if self.rope_theta <= 0 or self.rms_norm_eps <= 0:
            raise ValueError(
                f"DecoderConfig.rope_theta={self.rope_theta}, rms_norm_eps={self.rms_norm_eps};"
                " both must be > 0"
            )

    @property
    def resolved_head_dim(self) -> int:
        return self.head_dim if self.head_dim is not None else self.hidden_size // self.num_heads

    def replace(self, **changes: Any) -> DecoderConfig:
        """A copy with some fields changed (e.g. `cfg.replace(dtype=jnp.bfloat16)`)."""
        return dataclasses.replace(self, **changes)


@struct.dataclass
class KVCache:
    """Fixed-size key/value cache.

    k: tuple of L arrays [B, Hkv, Dh, S] and v: tuple of L arrays [B, Hkv, S, Dh], one per
    layer -- keys with the slot axis minor, so a decode step's q.k streams them along S
    (3x faster on CPU than reducing a minor Dh); valid: bool [B, S] (slot holds a real
    token); index: int32 scalar, the next slot to write (the same for every row:
    left-padded prompts make the batch share slot positions while their RoPE positions
    differ). One buffer per layer (not one [L, ...] slab) lets XLA update each layer's
    buffer in place; with a slab it copied the whole cache before every layer's write.

    For a `scan_layers` model k and v are single arrays [B, L, Hkv, Dh, S] / [B, L, Hkv,
    S, Dh] (`stacked`): the layer scan only reads them, and every layer's new slots are
    written in one in-place update after it. The layer axis comes after the batch so that
    code slicing, sharding or gathering rows (axis 0) and growing slots (the last /
    second-to-last axis) treats both layouts alike via `jax.tree.map`.
    """

    k: tuple[jax.Array, ...] | jax.Array
    v: tuple[jax.Array, ...] | jax.Array
    valid: jax.Array
    index: jax.Array

    @property
    def max_len(self) -> int:
        return self.valid.shape[1]

    @property
    def stacked(self) -> bool:
        """True for the `scan_layers` layout (one [B, L, ...] array each for k and v)."""
        return not isinstance(self.k, tuple | list)


def init_cache(cfg: DecoderConfig, batch: int, max_len: int, dtype: Any = None) -> KVCache:
    """An empty cache of `max_len` slots per row (dtype defaults to `cfg.dtype`), in the
    layout of `cfg.scan_layers` (see `KVCache`)."""
    if batch < 1 or max_len < 1:
        raise ValueError(f"init_cache: batch={batch}, max_len={max_len}; both must be >= 1")
    dtype = cfg.dtype if dtype is None else dtype
    hkv, dh = cfg.num_kv_heads, cfg.resolved_head_dim
    if cfg.scan_layers:
        return KVCache(
            k=jnp.zeros((batch, cfg.num_layers, hkv, dh, max_len), dtype),
            v=jnp.zeros((batch, cfg.num_layers, hkv, max_len, dh), dtype),
            valid=jnp.zeros((batch, max_len), bool),
            index=jnp.zeros((), jnp.int32),
        )
    return KVCache(
        k=tuple(jnp.zeros((batch, hkv, dh, max_len), dtype) for _ in range(cfg.num_layers)),
        v=tuple(jnp.zeros((batch, hkv, max_len, dh), dtype) for _ in range(cfg.num_layers)),
        valid=jnp.zeros((batch, max_len), bool),
        index=jnp.zeros((), jnp.int32),
    )


def _check_cache_layout(cache: KVCache, cfg: DecoderConfig) -> None:
    """The cache has the model's layer count and layout (`scan_layers`), else ValueError."""
    if cfg.scan_layers:
        ok = cache.stacked and cache.k.ndim == cache.v.ndim == 5 and (
            cache.k.shape[1] == cache.v.shape[1] == cfg.num_layers)
        have = (f"k {getattr(cache.k, 'shape', None)}" if cache.stacked
                else f"a tuple of {len(cache.k)} per-layer buffers")
        want = f"stacked [B, num_layers={cfg.num_layers}, ...] arrays (scan_layers=True)"
    else:
        ok = not cache.stacked and len(cache.k) == len(cache.v) == cfg.num_layers
        have = (f"{len(cache.k)} k / {len(cache.v)} v buffers" if not cache.stacked
                else f"stacked k {cache.k.shape}")
        want = f"num_layers={cfg.num_layers} per-layer buffers (scan_layers=False)"
    if not ok:
        raise ValueError(f"cache has {have}; the model needs {want} (make it with "
                         "init_cache(cfg, ...))")


def positions_from_mask(attention_mask: jax.Array) -> jax.Array:
    """RoPE positions of a (left-)padded batch: `cumsum(mask) - 1`, clipped at 0 (int32)."""
    return jnp.maximum(jnp.cumsum(attention_mask.astype(jnp.int32), axis=-1) - 1, 0)


def _param(rngs: nnx.Rngs, shape, names, cfg: DecoderConfig, init: str = "normal") -> nnx.Param:
    if init == "normal":
        value = cfg.initializer_range * jax.random.normal(rngs.params(), shape, cfg.param_dtype)
    elif init == "ones":
        value = jnp.ones(shape, cfg.param_dtype)
    else:
        value = jnp.zeros(shape, cfg.param_dtype)
    return nnx.Param(value, out_sharding=tuple(names), eager_sharding=False)


class RMSNorm(nnx.Module):
    """`scale * x / sqrt(mean(x^2, -1) + eps)`, normalised in float32 (as HF does)."""

    def __init__(self, dim: int, cfg: DecoderConfig, names=("norm",), *, rngs: nnx.Rngs):
        self.eps = cfg.rms_norm_eps
        self.scale = _param(rngs, (dim,), names, cfg, init="ones")

    def __call__(self, x: jax.Array) -> jax.Array:
        dtype = x.dtype
        x32 = x.astype(jnp.float32)
        x32 = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
        # HF casts back to the input dtype before multiplying by the weight.
        return self.scale[...].astype(dtype) * x32.astype(dtype)


class Attention(nnx.Module):
    """Grouped-query self-attention with optional bias, q/k norm and a KV cache."""

    def __init__(self, cfg: DecoderConfig, *, rngs: nnx.Rngs):
        self.cfg = cfg
        d, h, hkv, dh = cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.resolved_head_dim
        self.q_kernel = _param(rngs, (d, h, dh), ("embed", "q_heads", "head_dim"), cfg)
        self.k_kernel = _param(rngs, (d, hkv, dh), ("embed", "kv_heads", "head_dim"), cfg)
        self.v_kernel = _param(rngs, (d, hkv, dh), ("embed", "kv_heads", "head_dim"), cfg)
        self.o_kernel = _param(rngs, (h, dh, d), ("q_heads", "head_dim", "embed"), cfg)
        if cfg.qkv_bias:
            self.q_bias = _param(rngs, (h, dh), ("q_heads", "head_dim"), cfg, init="zeros")
            self.k_bias = _param(rngs, (hkv, dh), ("kv_heads", "head_dim"), cfg, init="zeros")
            self.v_bias = _param(rngs, (hkv, dh), ("kv_heads", "head_dim"), cfg, init="zeros")
        if cfg.qk_norm:
            self.q_norm = RMSNorm(dh, cfg, names=("head_dim",), rngs=rngs)
            self.k_norm = RMSNorm(dh, cfg, names=("head_dim",), rngs=rngs)

    def _project(self, x, kernel, bias_name):
        y = jnp.einsum("btd,dhk->bthk", x, kernel[...].astype(x.dtype))
        if self.cfg.qkv_bias:
            y = y + getattr(self, bias_name)[...].astype(x.dtype)
        return y

    def __call__(
        self,
        x: jax.Array,
        rope: tuple[jax.Array, jax.Array],
        mask: jax.Array,
        cache_kv: tuple[jax.Array, jax.Array] | None,
        index: jax.Array | None,
        last_only: bool = False,
        layer: jax.Array | int | None = None,
    ) -> tuple[jax.Array, tuple[jax.Array, jax.Array] | None]:
        """x: [B, T, D]; rope: `rope_tables` of the positions; mask: bool [B, T, S] (query t
        may attend key slot s).

        With `cache_kv = (k, v)` (this layer's buffers, layouts as in `KVCache`) the new
        keys/values are written at slots [index, index + T) and the updated buffers returned.
        With `layer` set, `cache_kv` are the stacked [B, L, ...] buffers of every layer, read
        only: layer `layer`'s keys/values attend as if written, and what comes back is the
        new slots alone (keys [B, Hkv, Dh, T], values [B, Hkv, T, Dh]) for the caller to
        store after the layer scan. Why: XLA:CPU copied the whole stacked cache twice per
        scan step when the scan body both read and updated it in place.
        `last_only`: keys/values of all T tokens, but the output [B, 1, D] of the last query
        only (the last layer of a prefill that needs the next-token logits alone).
        """
        cfg = self.cfg
        cos, sin = rope
        x_q, cos_q, sin_q = x, cos, sin
        if last_only:  # queries (and their mask rows) of the last token only
            x_q, cos_q, sin_q, mask = x[:, -1:], cos[:, -1:], sin[:, -1:], mask[:, -1:]
        q = self._project(x_q, self.q_kernel, "q_bias")
        k = self._project(x, self.k_kernel, "k_bias")
        v = self._project(x, self.v_kernel, "v_bias")
        if cfg.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = apply_rope(q, cos_q, sin_q), apply_rope(k, cos, sin)

        b, t, h, dh = q.shape
        hkv = cfg.num_kv_heads
        # Scale q (T x Dh values), not the scores (T x S): one pass less over the largest
        # array of a prefill.
        q = (q.astype(jnp.float32) / jnp.sqrt(jnp.float32(dh))).astype(q.dtype)
        q = q.reshape(b, t, hkv, h // hkv, dh)
        if t == k.shape[1] and (cache_kv is None or cache_kv[0].shape[-1] == t):
            # The T queries are the T key slots: no cache, or a prompt filling a fresh cache
            # (a T-token write into T slots replaces the whole buffer whatever `index` is).
            fn = (fused_causal_attention if cfg.attention_impl == "dot_product"
                  else causal_attention)
            out, k, v = fn(q, k, v, mask)
            out = out.astype(x.dtype).reshape(b, t, h, dh)
            if cache_kv is not None:
                cache_kv = (k.astype(cache_kv[0].dtype), v.astype(cache_kv[1].dtype))
            return self._output(out), cache_kv

        # Cache layouts (see KVCache): keys [B, Hkv, Dh, S], values [B, Hkv, S, Dh].
        k = jnp.transpose(k, (0, 2, 3, 1))
        v = jnp.transpose(v, (0, 2, 1, 3))
        if cache_kv is None:
            keys, values = k, v
        else:
            k_buf, v_buf = cache_kv
            if layer is not None:  # this layer's buffers of the (read-only) stack
                k_buf, v_buf = layer_buffer(k_buf, layer), layer_buffer(v_buf, layer)
            k_new, v_new = k.astype(k_buf.dtype), v.astype(v_buf.dtype)
            if layer is not None and k_new.shape[-1] == 1:  # one new token (T, not queries)
                # The stack's layer slice with the new slot selected in: one elementwise
                # pass (a dynamic_update_slice of the slice measured an extra copy of it).
                slot = jnp.arange(k_buf.shape[-1]) == index
                k_buf = jnp.where(slot, k_new, k_buf)
                v_buf = jnp.where(slot[:, None], v_new, v_buf)
            else:
                k_buf = jax.lax.dynamic_update_slice(k_buf, k_new, (0, 0, 0, index))
                v_buf = jax.lax.dynamic_update_slice(v_buf, v_new, (0, 0, index, 0))
            keys, values = k_buf.astype(x.dtype), v_buf.astype(x.dtype)
            cache_kv = (k_buf, v_buf) if layer is None else (k_new, v_new)
        if t == 1:
            # Single-token decode, memory-bound on the cache: broadcast-multiply + reduce
            # over a non-minor axis, so both reductions stream the cache with S (keys) or
            # Dh (values) as the vector lane -- 3x faster on CPU than contracting the minor
            # Dh of a [.., S, Dh] key cache. (The same two contractions as einsums measured
            # 24 vs 17 ms per batch-64 decode step on CPU.)
            q1 = q[:, 0].astype(jnp.float32)  # [B, Hkv, G, Dh]
            scores = jnp.sum(q1[..., None] * keys[:, :, None].astype(jnp.float32), axis=3)
            scores = jnp.where(mask[:, 0][:, None, None, :], scores, MASK_VALUE)  # [B,K,G,S]
            probs = jax.nn.softmax(scores, axis=-1).astype(x.dtype)
            out = jnp.sum(probs[..., None] * values[:, :, None], axis=3)  # [B, Hkv, G, Dh]
            out = out.reshape(b, 1, h, dh)
        else:
            out = attend(q, keys, values, mask).astype(x.dtype).reshape(b, t, h, dh)
        return self._output(out), cache_kv

    def _output(self, out: jax.Array) -> jax.Array:
        """[B, T, H, Dh] -> [B, T, D] as one [B*T, H*Dh] @ [H*Dh, D] matmul: contracting
        (h, k) in an einsum let XLA:CPU fuse the attention reduction into the dot (5.7 ms
        per decode step at batch 64)."""
        b, t, h, dh = out.shape
        o_kernel = self.o_kernel[...].astype(out.dtype).reshape(h * dh, -1)
        return (out.reshape(b * t, h * dh) @ o_kernel).reshape(b, t, -1)


class MLP(nnx.Module):
    """SwiGLU: `down(silu(gate(x)) * up(x))`."""

    def __init__(self, cfg: DecoderConfig, *, rngs: nnx.Rngs):
        d, f = cfg.hidden_size, cfg.intermediate_size
        self.gate = _param(rngs, (d, f), ("embed", "mlp"), cfg)
        self.up = _param(rngs, (d, f), ("embed", "mlp"), cfg)
        self.down = _param(rngs, (f, d), ("mlp", "embed"), cfg)

    def __call__(self, x: jax.Array) -> jax.Array:
        g = x @ self.gate[...].astype(x.dtype)
        u = x @ self.up[...].astype(x.dtype)
        return (jax.nn.silu(g) * u) @ self.down[...].astype(x.dtype)


class Block(nnx.Module):
    """Pre-norm transformer block."""

    def __init__(self, cfg: DecoderConfig, *, rngs: nnx.Rngs):
        self.attn_norm = RMSNorm(cfg.hidden_size, cfg, rngs=rngs)
        self.attn = Attention(cfg, rngs=rngs)
        self.mlp_norm = RMSNorm(cfg.hidden_size, cfg, rngs=rngs)
        self.mlp = MLP(cfg, rngs=rngs)

    def __call__(self, x, rope, mask, cache_kv, index, last_only=False, layer=None):
        a, cache_kv = self.attn(self.attn_norm(x), rope, mask, cache_kv, index, last_only,
                                layer)
        x = constrain_batch((x[:, -1:] if last_only else x) + a)
        x = constrain_batch(x + self.mlp(self.mlp_norm(x)))
        return x, cache_kv


def _stack_blocks(blocks: list[Block]) -> Block:
    """One `Block` whose every parameter is the [L, ...] stack of `blocks`' parameters,
    with the logical axis name "layers" in front of the layer's own names."""
    graphdef, _ = nnx.split(blocks[0])
    states = [nnx.state(b) for b in blocks]

    def stack(*variables):
        first = variables[0]
        names = first.get_metadata().get("out_sharding") or ()
        value = jnp.stack([v.get_value() for v in variables])
        return first.copy(value, out_sharding=("layers", *names))

    stacked = jax.tree.map(stack, *states, is_leaf=lambda x: isinstance(x, nnx.Variable))
    return nnx.merge(graphdef, stacked)


class Decoder(nnx.Module):
    """Decoder-only LM. `logits, cache = model(tokens, positions, cache=None, attention_mask=None)`.

    - tokens, positions: int32 [B, T]; attention_mask: bool [B, T] (True = real token;
      default all True). Returns float32 logits [B, T, V] ([B, 1, V] for the last position
      only with `last_only=True`, [B, T - logits_from, V] for positions >= the static int
      `logits_from`) and the updated cache (None when called without one).
    - Without a cache: causal attention over the T tokens, keys restricted to real tokens.
    - With a cache: the T tokens are written to slots [index, index + T) (the caller keeps
      index + T <= max_len; past the end `dynamic_update_slice` would clamp); each query
      attends to valid slots at or before its own slot; the cache comes back with index + T.
    """

    def __init__(self, cfg: DecoderConfig, *, rngs: nnx.Rngs):
        self.cfg = cfg
        self.embed = _param(rngs, (cfg.vocab_size, cfg.hidden_size), ("vocab", "embed"), cfg)
        blocks = [Block(cfg, rngs=rngs) for _ in range(cfg.num_layers)]
        # Scanned: the per-layer blocks built exactly as unrolled (same keys in the same
        # order, so one seed gives one set of weights in both layouts), then stacked.
        self.layers = _stack_blocks(blocks) if cfg.scan_layers else nnx.List(blocks)
        self.final_norm = RMSNorm(cfg.hidden_size, cfg, rngs=rngs)
        if not cfg.tie_embeddings:
            self.lm_head = _param(rngs, (cfg.hidden_size, cfg.vocab_size), ("embed", "vocab"), cfg)

    def __call__(
        self,
        tokens: jax.Array,
        positions: jax.Array,
        cache: KVCache | None = None,
        attention_mask: jax.Array | None = None,
        last_only: bool = False,
        logits_from: int = 0,
    ) -> tuple[jax.Array, KVCache | None]:
        cfg = self.cfg
        # Shapes are static, so these checks also run under jit.
        if tokens.ndim != 2 or positions.shape != tokens.shape:
            raise ValueError(
                f"tokens {tokens.shape} and positions {positions.shape} must both be [B, T]"
            )
        if attention_mask is not None and attention_mask.shape != tokens.shape:
            raise ValueError(
                f"attention_mask {attention_mask.shape} must match tokens {tokens.shape}"
            )
        b, t = tokens.shape
        if cache is not None and (cache.valid.shape[0] != b or t > cache.max_len):
            raise ValueError(
                f"cache holds batch {cache.valid.shape[0]} x {cache.max_len} slots; got "
                f"tokens {tokens.shape} (batch must match, T <= max_len)"
            )
        if cache is not None:
            _check_cache_layout(cache, cfg)
        if attention_mask is None:
            attention_mask = jnp.ones((b, t), bool)
        attention_mask = attention_mask.astype(bool)

        if cache is None:
            q_slot = jnp.arange(t)
            causal = q_slot[:, None] >= q_slot[None, :]  # [T, T]
            mask = causal[None] & attention_mask[:, None, :]
            index = None
        else:
            index = cache.index
            s = cache.max_len
            valid = jax.lax.dynamic_update_slice(cache.valid, attention_mask, (0, index))
            q_slot = index + jnp.arange(t)
            causal = q_slot[:, None] >= jnp.arange(s)[None, :]  # [T, S]
            mask = causal[None] & valid[:, None, :]

        rope = rope_tables(positions, cfg.resolved_head_dim, cfg.rope_theta)  # once, all layers
        # Gather rows from a table whose hidden dim is whole (the FSDP all-gather at use):
        # gathering from the `embed`-over-fsdp table would give activations split on the
        # hidden dim, which cannot be re-laid out to batch rows without rematerialising.
        table = constrain(self.embed[...], ("vocab", None))
        x = constrain_batch(jnp.take(table, tokens, axis=0).astype(cfg.dtype))
        if cfg.scan_layers:
            x, new_kv = self._scan_layers(x, rope, mask, cache, index, last_only)
        else:
            new_k, new_v = [], []
            for layer, block in enumerate(self.layers):
                layer_kv = None if cache is None else (cache.k[layer], cache.v[layer])
                # A sampler's prefill needs the next-token logits only: the last layer
                # computes its keys/values for every token (the cache) but its attention
                # output and MLP for the last one (a quarter of the maze policy's prefill
                # matmuls).
                x, layer_kv = block(x, rope, mask, layer_kv, index,
                                    last_only and layer == len(self.layers) - 1)
                if cache is not None:
                    new_k.append(layer_kv[0])
                    new_v.append(layer_kv[1])
            new_kv = (tuple(new_k), tuple(new_v))
        # `logits_from`: the head only at positions >= it (a training forward needs the
        # completion's predictions alone; the head is a large share of a big-vocab step).
        x = self.final_norm(x[:, logits_from:] if logits_from else x)
        if cfg.tie_embeddings:
            logits = jnp.einsum(
                "btd,vd->btv", x, self.embed[...].astype(x.dtype),
                preferred_element_type=jnp.float32,
            )
        else:
            logits = jnp.einsum(
                "btd,dv->btv", x, self.lm_head[...].astype(x.dtype),
                preferred_element_type=jnp.float32,
            )
        logits = logits.astype(jnp.float32)

        if cache is not None:
            cache = KVCache(k=new_kv[0], v=new_kv[1], valid=valid, index=index + t)
        return logits, cache

    def _scan_layers(self, x, rope, mask, cache, index, last_only):
        """The stacked blocks as one `lax.scan` (the `scan_layers` layout); returns x and
        the new stacked (k, v) (None without a cache).

        The stacked parameters are the scan's xs, so the backward pass gets their
        cotangents stacked directly. The stacked cache is only read inside the scan; each
        layer emits its T new slots ([L, ...] ys, tiny for a decode step), written into the
        cache once after the scan (in place). With `last_only` the first L-1 layers are
        scanned (their weights indexed by layer inside the body: slicing off the last layer
        would copy the others; this path is for inference) and the last one runs on its own
        for the last query.
        """
        num_layers = self.cfg.num_layers
        graphdef, params = nnx.split(self.layers)
        kv = None if cache is None else (cache.k, cache.v)

        def run(x, layer_params, layer, last):
            block = nnx.merge(graphdef, layer_params)
            return block(x, rope, mask, kv, index, last, layer)

        def weights_of(layer):
            return jax.tree.map(lambda p: p[layer], params)

        if not last_only:
            x, new = jax.lax.scan(lambda x, xs: run(x, *xs, False), x,
                                  (params, jnp.arange(num_layers, dtype=jnp.int32)))
        else:
            last = num_layers - 1
            if num_layers > 1:
                x, head = jax.lax.scan(lambda x, layer: run(x, weights_of(layer), layer, False),
                                       x, jnp.arange(last, dtype=jnp.int32))
            x, tail = run(x, weights_of(last), last, True)
            new = None if cache is None else jax.tree.map(
                lambda t, *h: jnp.concatenate([*h, t[None]]), tail,
                *((head,) if num_layers > 1 else ()))
        if cache is None:
            return x, None
        k_new, v_new = new
        return x, (store_new_slots(cache.k, k_new, index, 4),
                   store_new_slots(cache.v, v_new, index, 3))


def count_params(model: nnx.Module) -> int:
    """Total number of parameter scalars."""
    return sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.Param)))


def stacked_layer_path(cfg: DecoderConfig, path: tuple) -> tuple[tuple, int | None]:
    """(path in `nnx.state(model)`, index into its leading axis or None) of the per-layer
    path `("layers", i, *rest)` / `(name, ...)`: with `cfg.scan_layers`, layer i's
    parameter is row i of the stacked `("layers", *rest)` one."""
    if cfg.scan_layers and path[0] == "layers":
        return ("layers", *path[2:]), path[1]
    return path, None


def convert_layout(model: Decoder, scan_layers: bool) -> Decoder:
    """A `Decoder` with `model`'s weights in the layer layout `scan_layers` (`model` itself
    when it has that layout already).

    Unrolled -> scanned stacks `layers[i].<param>` into `layers.<param>[i]`; scanned ->
    unrolled slices them back; every other parameter is shared. The logits are the same up
    to float rounding. Arrays are stacked / sliced where they live; call
    `sharding.shard_model` on the result to place it by the partition rules again.
    """
    cfg = model.cfg
    if cfg.scan_layers == scan_layers:
        return model
    target = nnx.eval_shape(lambda: Decoder(cfg.replace(scan_layers=scan_layers),
                                            rngs=nnx.Rngs(0)))
    source = dict(nnx.to_flat_state(nnx.state(model)))
    state = nnx.state(target)
    for path, var in nnx.to_flat_state(state):
        if scan_layers and path[0] == "layers":  # path = ("layers", *rest)
            value = jnp.stack([source[("layers", i, *path[1:])].get_value()
                               for i in range(cfg.num_layers)])
        else:  # a shared parameter, or layer i's row of the scanned source
            at, layer = stacked_layer_path(cfg, path)
            value = source[at].get_value()
            value = value if layer is None else value[layer]
        var.set_value(value)
    nnx.update(target, state)
    return target
