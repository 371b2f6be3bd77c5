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
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx, struct

from sera_jax import sharding

#: Every logical axis name used in parameter `out_sharding` metadata.
LOGICAL_AXIS_NAMES = ("vocab", "embed", "q_heads", "kv_heads", "head_dim", "mlp", "norm",
                      "layers")

# Finite "minus infinity": a query whose every key is masked (a pad row) gets a uniform,
# finite softmax instead of NaN; its output is ignored downstream.
_MASK_VALUE = -0.7 * float(jnp.finfo(jnp.float32).max)


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

    def __post_init__(self):
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


def _context_mesh():
    """The current mesh (`jax.set_mesh`) when it has the `sharding.MESH_AXES`, else None."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty or not set(sharding.MESH_AXES) <= set(mesh.axis_names):
        return None
    return mesh


def constrain(x: jax.Array, logical: tuple[str | None, ...]) -> jax.Array:
    """`with_sharding_constraint` of x to logical axes `logical` under a mesh context.

    Only when the current mesh (`jax.set_mesh`) has the `sharding.MESH_AXES`; the spec is
    `sharding.logical_to_spec(logical, x.shape, mesh)` (axes that do not divide a dimension
    are dropped). Without a mesh x is returned unchanged, so single-device code is unaffected.
    """
    mesh = _context_mesh()
    if mesh is None:
        return x
    spec = sharding.logical_to_spec(logical, x.shape, mesh)
    return jax.lax.with_sharding_constraint(x, spec)


def batch_shards(batch: int) -> int:
    """How many shards `constrain_batch` splits a batch of `batch` rows into (1 without a mesh)."""
    mesh = _context_mesh()
    if mesh is None:
        return 1
    (axes,) = sharding.logical_to_spec(("batch",), (batch,), mesh)
    axes = () if axes is None else (axes,) if isinstance(axes, str) else axes
    return math.prod(mesh.shape[a] for a in axes)


def constrain_batch(x: jax.Array) -> jax.Array:
    """Activations [B, ...]: rows split over `sharding.BATCH_AXES`, the rest replicated.

    Why: with parameters sharded over `fsdp` along `embed`, GSPMD otherwise propagates a
    hidden dimension split over `fsdp` into the activations and then has to fully
    rematerialise them to reach the batch-split layout. No-op without a mesh context.
    """
    return constrain(x, ("batch",) + (None,) * (x.ndim - 1))


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


def rope_tables(positions: jax.Array, head_dim: int, theta: float) -> tuple[jax.Array, jax.Array]:
    """cos, sin [B, T, 1, Dh] (float32) of angles `pos * theta^(-2i/Dh)`, repeated over halves."""
    inv_freq = 1.0 / (theta ** (jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim))
    angles = positions.astype(jnp.float32)[..., None] * inv_freq  # [B, T, Dh/2]
    angles = jnp.concatenate([angles, angles], axis=-1)[:, :, None, :]
    return jnp.cos(angles), jnp.sin(angles)


def apply_rope(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
    """HF rotate_half rotary embedding: `x * cos + rotate_half(x) * sin`, x: [B, T, H, Dh]."""
    x32 = x.astype(jnp.float32)
    x1, x2 = jnp.split(x32, 2, axis=-1)
    rotated = jnp.concatenate([-x2, x1], axis=-1)
    return (x32 * cos + rotated * sin).astype(x.dtype)


#: Query block of the causal prefill / training attention (see `causal_attention`).
_QUERY_BLOCK = 128
#: Float32 score bytes per batch shard that one step of `causal_attention` materialises.
_SCORE_BLOCK_BYTES = 2 << 20


def _attend(q: jax.Array, keys: jax.Array, values: jax.Array, mask: jax.Array) -> jax.Array:
    """Softmax attention of q [B, T, Hkv, G, Dh] (already scaled) over keys [B, Hkv, Dh, S]
    and values [B, Hkv, S, Dh] with mask bool [B, T, S]; float32 [B, T, Hkv, G, Dh].

    The normalisation is applied to the output (T x Dh values) instead of the probabilities
    (T x S): one pass less over the largest array.
    """
    dtype = q.dtype
    upcast = dtype != jnp.float32 and jax.default_backend() == "cpu"
    if upcast:
        # XLA:CPU has no batched bf16 x bf16 -> f32 dot ("Unsupported element type for
        # DotThunk", jax 0.10): upcast the bf16 operands there (exact, and the same float32
        # accumulation; no bf16 speed to lose).
        q, keys, values = (x.astype(jnp.float32) for x in (q, keys, values))
    scores = jnp.einsum("btkgd,bkds->bkgts", q, keys, preferred_element_type=jnp.float32)
    scores = jnp.where(mask[:, None, None, :, :], scores, _MASK_VALUE)
    weights = jnp.exp(scores - jnp.max(scores, axis=-1, keepdims=True))
    total = jnp.sum(weights, axis=-1)  # [B, Hkv, G, T]
    # The probabilities are rounded to the compute dtype as on an accelerator, so the CPU's
    # bf16 numerics match the bf16 program's, upcast or not.
    weights = weights.astype(dtype)
    if upcast:
        weights = weights.astype(jnp.float32)
    out = jnp.einsum("bkgts,bksd->btkgd", weights, values, preferred_element_type=jnp.float32)
    return out / jnp.transpose(total, (0, 3, 1, 2))[..., None]


def map_row_chunks(fn: Any, args: tuple[jax.Array, ...], row_cost: int, budget: int) -> Any:
    """`fn` applied to row chunks of the [B, ...] arrays `args`, outputs merged back to [B, ...].

    A chunk holds the largest number of rows r per batch shard (`batch_shards(B)`) that
    divides the shard's rows with `r * row_cost <= budget` (at least 1), and one `lax.map`
    step takes r rows from *every* shard, so the map never moves rows between devices.
    `fn` maps a tuple of [rows, ...] arrays to a pytree of [rows, ...] arrays; the rows of a
    chunk must not interact. Why: a CPU keeps a chunk's intermediates in cache instead of
    streaming batch-sized arrays through memory once per elementwise pass. On other
    backends the whole batch is one chunk: an accelerator wants all rows at once.
    """
    if jax.default_backend() != "cpu":
        return fn(args)
    b = args[0].shape[0]
    shards = batch_shards(b)
    per_shard = b // shards
    rows = max(r for r in range(1, per_shard + 1)
               if per_shard % r == 0 and (r == 1 or r * row_cost <= budget))
    steps = per_shard // rows
    if steps == 1:
        return fn(args)

    def split(x):  # [B, ...] -> [steps, shards * rows, ...]
        x = x.reshape(shards, steps, rows, *x.shape[1:])
        x = jnp.moveaxis(x, 1, 0).reshape(steps, shards * rows, *x.shape[3:])
        return constrain(x, (None, "batch") + (None,) * (x.ndim - 2))

    def merge(x):
        x = x.reshape(steps, shards, rows, *x.shape[2:])
        return constrain_batch(jnp.moveaxis(x, 0, 1).reshape(b, *x.shape[3:]))

    return jax.tree.map(merge, jax.lax.map(fn, tuple(split(x) for x in args)))


def causal_attention(
    q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Attention where the T queries are the T key slots (a fresh prefill, the training forward).

    q [B, T, Hkv, G, Dh] (already scaled), k and v [B, T, Hkv, Dh] as projected, mask bool
    [B, T, T]. Returns the float32 output [B, T, Hkv, G, Dh] and k, v in the cache layouts
    (keys [B, Hkv, Dh, T], values [B, Hkv, T, Dh]).

    Two things keep the [T, T] scores cheap on a CPU: query block [c0, c1) attends to keys
    [0, c1) only (causal; a third less score work at T = 310), and the batch goes through
    `map_row_chunks` a few rows at a time, so a chunk's scores (at most `_SCORE_BLOCK_BYTES`
    per batch shard) and its layout transposes stay in cache (0.62x the time of the
    whole-batch version for the maze policy at batch 64, measured on one core).
    """
    _, t, hkv, g, _ = q.shape
    blocks = [(c0, min(c0 + _QUERY_BLOCK, t)) for c0 in range(0, t, _QUERY_BLOCK)]

    def attend_rows(args):
        q, k, v, mask = args
        k = jnp.transpose(k, (0, 2, 3, 1))
        v = jnp.transpose(v, (0, 2, 1, 3))
        out = jnp.concatenate([
            _attend(q[:, c0:c1], k[..., :c1], v[:, :, :c1], mask[:, c0:c1, :c1])
            for c0, c1 in blocks], axis=1)
        return out, k, v

    row_bytes = hkv * g * min(t, _QUERY_BLOCK) * t * 4
    return map_row_chunks(attend_rows, (q, k, v, mask), row_bytes, _SCORE_BLOCK_BYTES)


def _layer_buffer(buf: jax.Array, layer: Any) -> jax.Array:
    """Layer `layer`'s [B, Hkv, ...] buffer of a stacked [B, L, Hkv, ...] cache."""
    return jax.lax.dynamic_index_in_dim(buf, layer, axis=1, keepdims=False)


def _store_new_slots(buf: jax.Array, new: jax.Array, index: jax.Array, slot_axis: int
                     ) -> jax.Array:
    """A stacked cache buffer [B, L, Hkv, ...] with the layer scan's new slots `new`
    [L, B, Hkv, ...] (T slots along `slot_axis` of `buf`) written at slot `index`; a `new`
    that fills every slot (a fresh prefill) replaces the buffer."""
    new = jnp.moveaxis(new, 0, 1).astype(buf.dtype)
    if new.shape == buf.shape:
        return new
    starts = [0] * buf.ndim
    starts[slot_axis] = index
    return jax.lax.dynamic_update_slice(buf, new, starts)


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
            out, k, v = causal_attention(q, k, v, mask)
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
                k_buf, v_buf = _layer_buffer(k_buf, layer), _layer_buffer(v_buf, layer)
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
            scores = jnp.where(mask[:, 0][:, None, None, :], scores, _MASK_VALUE)  # [B,K,G,S]
            probs = jax.nn.softmax(scores, axis=-1).astype(x.dtype)
            out = jnp.sum(probs[..., None] * values[:, :, None], axis=3)  # [B, Hkv, G, Dh]
            out = out.reshape(b, 1, h, dh)
        else:
            out = _attend(q, keys, values, mask).astype(x.dtype).reshape(b, t, h, dh)
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
        return x, (_store_new_slots(cache.k, k_new, index, 4),
                   _store_new_slots(cache.v, v_new, index, 3))


def token_logprobs(
    model: Decoder,
    tokens: jax.Array,
    attention_mask: jax.Array,
    positions: jax.Array | None = None,
    start: int = 0,
) -> jax.Array:
    """Per-token log-likelihood aligned with `tokens`.

    out[b, t] = log p(tokens[b, t] | tokens[b, :t]), from one full forward (no cache);
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
