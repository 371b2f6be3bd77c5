"""Causal attention, the two `DecoderConfig.attention_impl` paths side by side: this package's
kernels (`causal_attention`, "plain") against `jax.nn.dot_product_attention`
(`fused_causal_attention`, "dot_product": cuDNN flash attention on an NVIDIA GPU, XLA's
reference path elsewhere), forward + backward at a long sequence. The accelerator check's
`attention` part (benchmarks/accelerator_check.py) calls `part_attention`.

Shapes: SmolLM2-360M's attention (15 query heads on 5 KV heads, head dim 64), 16 rows of
1,024 tokens, bfloat16, every key real (causal mask only); then "dot_product" alone at
4 x 4,096 (on an H200 the plain path did not compile there within 60 s, 2026-12-04).
FLOPs counted: causal forward 2·B·H·T²·Dh (QKᵀ and PV over the lower triangle), backward
2.5× that, so fwd+bwd = 7·B·H·T²·Dh.
"""

from __future__ import annotations

import time
from typing import Any


def _inputs(b: int, t: int, hkv: int, g: int, dh: int):
    """Random bf16 q (scaled), k, v and the causal mask of `causal_attention`'s shapes."""
    import jax
    import jax.numpy as jnp

    keys = jax.random.split(jax.random.key(0), 3)
    dtype = jnp.bfloat16
    q = jax.random.normal(keys[0], (b, t, hkv, g, dh), dtype) / jnp.sqrt(dh).astype(dtype)
    k = jax.random.normal(keys[1], (b, t, hkv, dh), dtype)
    v = jax.random.normal(keys[2], (b, t, hkv, dh), dtype)
    return q, k, v, jnp.broadcast_to(jnp.tril(jnp.ones((t, t), bool)), (b, t, t))


def part_attention(smoke: bool, deadline: float) -> dict[str, Any]:
    """Time fwd+bwd of both attention paths; report the fused path's time, the plain one's,
    the speed ratio, whether cuDNN was taken, and the largest output difference."""
    import jax
    import jax.numpy as jnp

    from sera_jax.models import attention as att

    b, t, hkv, g, dh = (2, 64, 2, 2, 16) if smoke else (16, 1024, 5, 3, 64)
    long_b, long_t = (1, 128) if smoke else (4, 4096)
    q, k, v, mask = _inputs(b, t, hkv, g, dh)

    def program(fn, mask=mask):
        def loss(q, k, v):
            return jnp.sum(fn(q, k, v, mask)[0].astype(jnp.float32) ** 2)
        return jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2)))

    notes, timings, outputs = [], {}, {}
    for name, fn in (("plain", att.causal_attention), ("dot_product", att.fused_causal_attention)):
        try:
            step = program(fn)
            t0 = time.perf_counter()
            jax.block_until_ready(step(q, k, v))
            compile_s = time.perf_counter() - t0
            runs = []
            while len(runs) < 10 and (not runs or time.time() + 2 * max(runs) < deadline):
                t0 = time.perf_counter()
                jax.block_until_ready(step(q, k, v))
                runs.append(time.perf_counter() - t0)
            timings[name] = (min(runs), compile_s)
            outputs[name] = jax.jit(lambda q, k, v, fn=fn: fn(q, k, v, mask)[0])(q, k, v)
        except Exception as error:  # noqa: BLE001 -- one path failing is the finding
            notes.append(f"{name} FAILED: {type(error).__name__}: {str(error)[:300]}")
    if len(timings) < 2:
        raise RuntimeError("; ".join(notes))
    diff = float(jnp.max(jnp.abs(outputs["plain"] - outputs["dot_product"])))
    try:  # cuDNN's kernel with its own causal mask (no mask array): is it available at all?
        jax.block_until_ready(jax.jit(lambda: jax.nn.dot_product_attention(
            q.reshape(b, t, hkv * g, dh), k, v, is_causal=True, implementation="cudnn"))())
        cudnn = "available"
    except Exception as error:  # noqa: BLE001 -- reported, not raised
        cudnn = f"not taken ({type(error).__name__})"
    flops = 7.0 * b * hkv * g * t * t * dh
    try:  # the fused path alone at a length the plain one cannot compile in time
        lq, lk, lv, lmask = _inputs(long_b, long_t, hkv, g, dh)
        step = program(att.fused_causal_attention, lmask)
        jax.block_until_ready(step(lq, lk, lv))
        runs = []
        while len(runs) < 5 and (not runs or time.time() + 2 * max(runs) < deadline):
            t0 = time.perf_counter()
            jax.block_until_ready(step(lq, lk, lv))
            runs.append(time.perf_counter() - t0)
        long_flops = 7.0 * long_b * hkv * g * long_t * long_t * dh
        notes.append(f"dot_product at {long_b} x {long_t}: {min(runs) * 1e3:.2f} ms "
                     f"({long_flops / min(runs) / 1e12:.3g} TFLOP/s)")
    except Exception as error:  # noqa: BLE001 -- reported, not raised
        notes.append(f"dot_product at {long_b} x {long_t} FAILED: {type(error).__name__}")
    plain_s, fused_s = timings["plain"][0], timings["dot_product"][0]
    notes.append(f"plain {plain_s * 1e3:.2f} ms ({flops / plain_s / 1e12:.3g} TFLOP/s); "
                 f"dot_product/plain time {fused_s / plain_s:.3f}; cuDNN {cudnn}; "
                 f"max |Δ out| {diff:.3g} (bf16)")
    return {"model": "causal attention fwd+bwd (dot_product vs plain)",
            "shape": f"B {b} x T {t}, {hkv * g} heads / {hkv} KV, Dh {dh}",
            "dtype": "bfloat16", "mesh": "1 device", "time_s": fused_s,
            "compile_s": timings["dot_product"][1], "tokens_per_s": b * t / fused_s,
            "flops": flops, "chips": 1, "plain_s": plain_s, "plain_compile_s":
            timings["plain"][1], "ratio_fused_over_plain": fused_s / plain_s, "cudnn": cudnn,
            "max_abs_diff": diff, "notes": notes}
