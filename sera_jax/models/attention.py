"""The decoder's parameter-free attention machinery: RoPE, the attention kernels, the
stacked KV-cache slot helpers and the activation sharding constraints.

Shapes: queries q [B, T, Hkv, G, Dh] (G = num_heads // num_kv_heads, already scaled by
1/sqrt(Dh)); the cache layouts of `sera_jax.models.decoder.KVCache`: keys [B, Hkv, Dh, S]
(slot axis minor), values [B, Hkv, S, Dh]. Scores and softmax sums are float32.

The `nnx` modules that hold the projections (`Attention`, `Block`, `Decoder`) live in
`sera_jax.models.decoder`; everything here is a pure function of arrays.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp

from sera_jax import sharding

#: Finite "minus infinity": a query whose every key is masked (a pad row) gets a uniform,
#: finite softmax instead of NaN; its output is ignored downstream.
MASK_VALUE = -0.7 * float(jnp.finfo(jnp.float32).max)


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


def attend(q: jax.Array, keys: jax.Array, values: jax.Array, mask: jax.Array) -> jax.Array:
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
    scores = jnp.where(mask[:, None, None, :, :], scores, MASK_VALUE)
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


#: `DecoderConfig.attention_impl` values: today's kernels, or `jax.nn.dot_product_attention`.
ATTENTION_IMPLS = ("plain", "dot_product")


def fused_causal_attention(
    q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """`causal_attention` through `jax.nn.dot_product_attention` (same arguments, results).

    On an NVIDIA GPU with bf16/fp16 operands this is cuDNN's fused flash attention (the
    [T, T] scores never reach memory); elsewhere XLA's reference attention. Grouped-query
    heads map as in `attend` (query head `kv * G + g` reads kv head `kv`); q is already
    scaled, so `scale=1`. Rows whose every key is masked (pad queries) differ from
    `attend`'s uniform softmax; they are ignored downstream, as there.
    """
    b, t, hkv, g, dh = q.shape
    # jax's default (implementation=None) is XLA's path on every backend: ask for cuDNN
    # where its fused kernel applies (NVIDIA GPU, 16-bit operands, head dim <= 128, % 8).
    cudnn = (jax.default_backend() == "gpu" and q.dtype in (jnp.bfloat16, jnp.float16)
             and dh <= 128 and dh % 8 == 0)
    out = jax.nn.dot_product_attention(
        q.reshape(b, t, hkv * g, dh), k.astype(q.dtype), v.astype(q.dtype),
        mask=mask[:, None, :, :], scale=1.0, implementation="cudnn" if cudnn else None)
    out = out.astype(jnp.float32).reshape(b, t, hkv, g, dh)
    return out, jnp.transpose(k, (0, 2, 3, 1)), jnp.transpose(v, (0, 2, 1, 3))


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
            attend(q[:, c0:c1], k[..., :c1], v[:, :, :c1], mask[:, c0:c1, :c1])
            for c0, c1 in blocks], axis=1)
        return out, k, v

    row_bytes = hkv * g * min(t, _QUERY_BLOCK) * t * 4
    return map_row_chunks(attend_rows, (q, k, v, mask), row_bytes, _SCORE_BLOCK_BYTES)


def layer_buffer(buf: jax.Array, layer: Any) -> jax.Array:
    """Layer `layer`'s [B, Hkv, ...] buffer of a stacked [B, L, Hkv, ...] cache."""
    return jax.lax.dynamic_index_in_dim(buf, layer, axis=1, keepdims=False)


def store_new_slots(buf: jax.Array, new: jax.Array, index: jax.Array, slot_axis: int
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
