"""SmolLM2-135M-Instruct as a tunix Llama-3 model: the embedded GGUF's weights (our float32
`Decoder`, `sera_jax.models.embedded.load_smollm2`) copied into `tunix.models.llama3`.

SmolLM2 is a Llama architecture (30 layers, hidden 576, 9 heads of 64, 3 KV heads, SwiGLU
1536, tied embeddings, RMSNorm eps 1e-5, RoPE theta 100 000), and tunix's Llama-3 keeps the
same parameter layouts as our decoder ([D, H, Dh] q/k/v kernels, [H, Dh, D] output, [D, F] /
[F, D] MLP), so the copy is one array per parameter with no transposes.

One fix is needed: tunix 0.1.7's `llama3.Attention.block` calls `apply_rope` without
`rope_theta`, so every tunix Llama-3 rotates with the default theta 1 000 000 whatever
`ModelConfig.rope_theta` says. `RopeThetaAttention` is tunix's block with `rope_theta` passed;
`to_tunix` builds the model with it, so the logits match ours (max |Δ| stated in
docs/tunix.md, checked by tests/integrations/test_tunix.py).

`TunixTokenizer` wraps our `Tokenizer` in the interface tunix's `TokenizerAdapter` accepts.
Its pad id is `<|endoftext|>` (0), not the GGUF's padding id: that one is `<|im_end|>`, which
every chat prompt contains, and tunix derives masks from `ids != pad_id`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from tunix.models.llama3 import model as llama3

from sera_jax.models.decoder import Decoder, DecoderConfig
from sera_jax.models.tokenizer import Tokenizer


class RopeThetaAttention(llama3.Attention):
    """tunix 0.1.7's `llama3.Attention` with RoPE at `config.rope_theta` (its `block`
    passes no theta, so `apply_rope`'s default 1e6 is used); otherwise the same code."""

    def block(self, x: jax.Array, segment_pos: jax.Array, cache: dict | None,
              attn_mask: jax.Array | None) -> tuple[dict | None, jax.Array]:
        seq_len = x.shape[1]
        shd_config = self.shd_config
        query = llama3.shard(self.q_proj(x), shd_config.act_btnh)
        key = llama3.shard(self.k_proj(x), shd_config.act_btnh)
        value = llama3.shard(self.v_proj(x), shd_config.act_btnh)
        theta = self.config.rope_theta
        query = llama3.apply_rope(query, segment_pos, head_dim=self.head_dim, rope_theta=theta)
        key = llama3.apply_rope(key, segment_pos, head_dim=self.head_dim, rope_theta=theta)
        if cache is not None:
            end_index = cache["end_index"][0]
            slice_indices = (0, end_index % cache["v"].shape[1], 0, 0)
            value = jax.lax.dynamic_update_slice(cache["v"], value, slice_indices)
            key = jax.lax.dynamic_update_slice(cache["k"], key, slice_indices)
        b, t, qh, d = query.shape
        _, s, kh, _ = key.shape
        query = query.reshape((b, t, kh, qh // kh, d))
        attn = jnp.einsum("BTHGD,BSHD->BHGTS", query, key) * self.scale
        attn = attn.reshape((b, qh, t, s))
        if attn_mask is not None:
            attn = jnp.where(jnp.expand_dims(attn_mask, -3), attn, llama3.K_MASK)
        attn = jax.nn.softmax(attn.astype(jnp.float32), axis=-1).astype(key.dtype)
        attn = attn.reshape((b, kh, qh // kh, t, s))
        out = jnp.einsum("BHGTS,BSHD->BTHGD", attn, value).reshape((b, t, qh, d))
        out = llama3.shard(self.o_proj(out), shd_config.act_btd)
        new_cache = None if cache is None else {
            "v": value, "k": key, "end_index": cache["end_index"] + seq_len}
        return new_cache, out


def tunix_config(cfg: DecoderConfig) -> llama3.ModelConfig:
    """tunix's Llama-3 `ModelConfig` of a plain Llama-architecture `DecoderConfig`; ValueError
    for features tunix's Llama-3 lacks (q/k/v bias, q/k norm)."""
    if cfg.qkv_bias or cfg.qk_norm:
        raise ValueError(f"{cfg.name or 'this config'}: tunix's Llama-3 has no q/k/v bias or "
                         "q/k norm (qkv_bias / qk_norm must be False)")
    return llama3.ModelConfig(
        num_layers=cfg.num_layers, vocab_size=cfg.vocab_size, embed_dim=cfg.hidden_size,
        hidden_dim=cfg.intermediate_size, num_heads=cfg.num_heads,
        head_dim=cfg.resolved_head_dim, num_kv_heads=cfg.num_kv_heads,
        rope_theta=cfg.rope_theta, norm_eps=cfg.rms_norm_eps,
        weight_tying=cfg.tie_embeddings)


def param_pairs(num_layers: int, tied: bool = True) -> list[tuple[tuple, tuple]]:
    """(our path, tunix path) of every parameter (our unrolled layout)."""
    pairs = [(("embed",), ("embedder", "input_embedding")),
             (("final_norm", "scale"), ("final_norm", "w"))]
    if not tied:
        pairs.append((("lm_head",), ("lm_head", "w")))
    for i in range(num_layers):
        ours, theirs = ("layers", i), ("layers", i)
        pairs += [
            ((*ours, "attn_norm", "scale"), (*theirs, "input_layernorm", "w")),
            ((*ours, "mlp_norm", "scale"), (*theirs, "post_attention_layernorm", "w")),
            *[((*ours, "attn", f"{n}_kernel"), (*theirs, "attn", f"{n}_proj", "w"))
              for n in ("q", "k", "v", "o")],
            *[((*ours, "mlp", n), (*theirs, "mlp", f"{n}_proj", "kernel"))
              for n in ("gate", "up", "down")],
        ]
    return pairs


def _get(tree: Any, path: tuple) -> Any:
    for key in path:
        tree = tree[key]
    return tree


def to_tunix(model: Decoder, seed: int = 0) -> llama3.Llama3:
    """A tunix `Llama3` (with `RopeThetaAttention`) holding copies of `model`'s parameters
    (unrolled layers; float32 as loaded)."""
    cfg = model.cfg
    if cfg.scan_layers:
        raise ValueError("to_tunix needs the unrolled layout (DecoderConfig.scan_layers=False)")
    config = tunix_config(cfg)
    rngs = nnx.Rngs(seed)
    out = llama3.Llama3(config, rngs=rngs)
    for layer in out.layers:
        layer.attn = RopeThetaAttention(config, rngs=rngs)
    ours, theirs = nnx.state(model, nnx.Param), nnx.state(out, nnx.Param)
    for src, dst in param_pairs(cfg.num_layers, cfg.tie_embeddings):
        a, b = _get(ours, src), _get(theirs, dst)
        if a.shape != b.shape:
            raise ValueError(f"{src} {a.shape} does not fit tunix's {dst} {b.shape}")
        b.value = jnp.array(a.value, dtype=b.value.dtype)
    nnx.update(out, theirs)
    return out


def grads_as_ours(tunix_grads: Any, num_layers: int, tied: bool = True
                  ) -> dict[tuple, jax.Array]:
    """{our path: array} of a tunix gradient (or parameter) state (`param_pairs`)."""
    return {src: jnp.asarray(_get(tunix_grads, dst).value if hasattr(_get(tunix_grads, dst),
                                                                    "value")
                             else _get(tunix_grads, dst))
            for src, dst in param_pairs(num_layers, tied)}


class TunixTokenizer:
    """Our `Tokenizer` in the interface tunix's `TokenizerAdapter` accepts (encode, decode,
    bos_id, eos_id, pad_id). No BOS is added (chat prompts start with `<|im_start|>`, as in
    our trainer); eos is `<|im_end|>`; pad is `pad_token` (default `<|endoftext|>`)."""

    def __init__(self, tokenizer: Tokenizer, pad_token: str = "<|endoftext|>"):
        self.tokenizer = tokenizer
        self._pad = tokenizer.token_id(pad_token)

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.vocab_size

    def encode(self, text: str, **_: Any) -> list[int]:
        return self.tokenizer.encode(text).tolist()

    def decode(self, ids: Sequence[int], **_: Any) -> str:
        return self.tokenizer.decode([int(i) for i in ids if int(i) != self._pad])

    def bos_id(self) -> int | None:
        return None

    def eos_id(self) -> int:
        return self.tokenizer.eos_id

    def pad_id(self) -> int:
        return self._pad

    def stop_ids(self) -> list[int]:
        """Every id generation stops at (our tokenizer's `stop_ids`)."""
        return [int(i) for i in self.tokenizer.stop_ids]


def logits_difference(ours: Decoder, theirs: llama3.Llama3, tokens: np.ndarray) -> float:
    """max |logits_ours − logits_tunix| over every position of `tokens` [B, T] (no padding)."""
    tokens = jnp.asarray(tokens, jnp.int32)
    b, t = tokens.shape
    positions = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
    lo, _ = ours(tokens, positions)
    mask = jnp.broadcast_to(jnp.tril(jnp.ones((t, t), bool)), (b, t, t))
    lt, _ = theirs(tokens, positions, None, mask)
    return float(jnp.max(jnp.abs(lo - lt)))


__all__ = ["RopeThetaAttention", "TunixTokenizer", "grads_as_ours", "logits_difference",
           "param_pairs", "to_tunix", "tunix_config"]
