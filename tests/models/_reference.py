"""Test helpers: random HF-format tensors and an independent NumPy forward of the HF models.

The reference follows transformers' Llama/Qwen2/Qwen3 modelling code directly on
HF-named `[out, in]` tensors (float64), so it shares nothing with the JAX decoder's layout
conversion.
"""

from __future__ import annotations

import json
import os

import numpy as np
from safetensors.numpy import save_file


def tiny_hf_config(model_type: str = "llama", tied: bool = True, **kw) -> dict:
    cfg = {
        "model_type": model_type,
        "architectures": [{"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM",
                           "qwen3": "Qwen3ForCausalLM"}[model_type]],
        "vocab_size": 61,
        "hidden_size": 48,
        "intermediate_size": 80,
        "num_hidden_layers": 2,
        "num_attention_heads": 6,
        "num_key_value_heads": 2,
        "head_dim": 8,
        "hidden_act": "silu",
        "rope_theta": 5000.0,
        "rms_norm_eps": 1e-5,
        "attention_bias": model_type == "qwen2",
        "tie_word_embeddings": tied,
        "max_position_embeddings": 256,
        "torch_dtype": "float32",
    }
    cfg.update(kw)
    return cfg


def random_hf_tensors(cfg: dict, seed: int = 0) -> dict[str, np.ndarray]:
    """Random float32 tensors under HF names (norm scales and biases random too)."""
    rng = np.random.default_rng(seed)
    d, f, v = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    h, hkv, dh = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]

    def w(*shape, scale=0.1):
        return (scale * rng.standard_normal(shape)).astype(np.float32)

    t = {"model.embed_tokens.weight": w(v, d, scale=0.5),
         "model.norm.weight": 1 + w(d)}
    if not cfg["tie_word_embeddings"]:
        t["lm_head.weight"] = w(v, d, scale=0.3)
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        t[p + "input_layernorm.weight"] = 1 + w(d)
        t[p + "post_attention_layernorm.weight"] = 1 + w(d)
        t[p + "self_attn.q_proj.weight"] = w(h * dh, d, scale=0.3)
        t[p + "self_attn.k_proj.weight"] = w(hkv * dh, d, scale=0.3)
        t[p + "self_attn.v_proj.weight"] = w(hkv * dh, d)
        t[p + "self_attn.o_proj.weight"] = w(d, h * dh)
        t[p + "mlp.gate_proj.weight"] = w(f, d)
        t[p + "mlp.up_proj.weight"] = w(f, d)
        t[p + "mlp.down_proj.weight"] = w(d, f)
        if cfg["model_type"] == "qwen2" or cfg.get("attention_bias"):
            for n, rows in (("q", h), ("k", hkv), ("v", hkv)):
                t[p + f"self_attn.{n}_proj.bias"] = w(rows * dh)
        if cfg["model_type"] == "qwen3":
            t[p + "self_attn.q_norm.weight"] = 1 + w(dh)
            t[p + "self_attn.k_norm.weight"] = 1 + w(dh)
    return t


def write_hf_checkpoint(path, cfg: dict, tensors: dict[str, np.ndarray]) -> None:
    os.makedirs(path, exist_ok=True)
    save_file(tensors, os.path.join(path, "model.safetensors"))
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(cfg, f)


def _rms(x, w, eps):
    return w * (x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps))


def _rope(x, pos, theta):  # x [T, H, Dh]; rotate_half convention
    dh = x.shape[-1]
    inv = 1.0 / theta ** (np.arange(0, dh, 2) / dh)
    ang = pos[:, None] * inv
    ang = np.concatenate([ang, ang], -1)[:, None, :]
    x1, x2 = x[..., : dh // 2], x[..., dh // 2 :]
    return x * np.cos(ang) + np.concatenate([-x2, x1], -1) * np.sin(ang)


def reference_logits(cfg: dict, t: dict[str, np.ndarray], tokens: np.ndarray) -> np.ndarray:
    """HF-semantics logits [T, V] (float64) of one unpadded sequence at positions 0..T-1."""
    t = {k: v.astype(np.float64) for k, v in t.items()}
    h, hkv, dh = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    eps, theta = cfg["rms_norm_eps"], cfg["rope_theta"]
    n = len(tokens)
    pos = np.arange(n, dtype=np.float64)
    x = t["model.embed_tokens.weight"][tokens]
    causal = np.tril(np.ones((n, n), bool))
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        a = _rms(x, t[p + "input_layernorm.weight"], eps)

        def proj(name, heads, a=a, p=p):
            y = a @ t[p + f"self_attn.{name}_proj.weight"].T
            if p + f"self_attn.{name}_proj.bias" in t:
                y = y + t[p + f"self_attn.{name}_proj.bias"]
            return y.reshape(n, heads, dh)

        q, k, v = proj("q", h), proj("k", hkv), proj("v", hkv)
        if p + "self_attn.q_norm.weight" in t:
            q = _rms(q, t[p + "self_attn.q_norm.weight"], eps)
            k = _rms(k, t[p + "self_attn.k_norm.weight"], eps)
        q, k = _rope(q, pos, theta), _rope(k, pos, theta)
        k, v = np.repeat(k, h // hkv, axis=1), np.repeat(v, h // hkv, axis=1)
        s = np.einsum("thd,shd->hts", q, k) / np.sqrt(dh)
        s = np.where(causal, s, -np.inf)
        s = np.exp(s - s.max(-1, keepdims=True))
        s = s / s.sum(-1, keepdims=True)
        o = np.einsum("hts,shd->thd", s, v).reshape(n, h * dh)
        x = x + o @ t[p + "self_attn.o_proj.weight"].T
        m = _rms(x, t[p + "post_attention_layernorm.weight"], eps)
        g = m @ t[p + "mlp.gate_proj.weight"].T
        u = m @ t[p + "mlp.up_proj.weight"].T
        x = x + (g / (1 + np.exp(-g)) * u) @ t[p + "mlp.down_proj.weight"].T
    x = _rms(x, t["model.norm.weight"], eps)
    head = t["lm_head.weight"] if "lm_head.weight" in t else t["model.embed_tokens.weight"]
    return x @ head.T
