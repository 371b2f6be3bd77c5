"""Named decoder configurations and conversion from a Hugging Face `config.json`.

The published presets copy the architecture fields of each model's `config.json` on the
Hugging Face hub (HuggingFaceTB/SmolLM2-135M(-Instruct), HuggingFaceTB/SmolLM2-360M,
Qwen/Qwen2.5-Math-1.5B, Qwen/Qwen3-4B).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax.numpy as jnp

from sera_jax.models.decoder import DecoderConfig

#: Dtype names a config may give for compute (`model.dtype`), parameters and KV caches.
#: float16 is left out on purpose: without loss scaling its range overflows in training.
DTYPE_NAMES = ("float32", "bfloat16")
#: Values of a config's `kv_cache_dtype` field and what the error message says about them.
CACHE_DTYPE_NAMES = ("",) + DTYPE_NAMES
CACHE_DTYPE_HELP = f"'' (the model's compute dtype) or one of {DTYPE_NAMES}"


def dtype_from_name(name: str, field: str = "dtype") -> Any:
    """The jnp dtype of a config's dtype name (one of `DTYPE_NAMES`); ValueError naming
    `field` otherwise."""
    if name not in DTYPE_NAMES:
        raise ValueError(f"config.{field}={name!r} is invalid; allowed: one of {DTYPE_NAMES}")
    return jnp.dtype(name)

#: The maze policy of the paper: a small tied-embedding Qwen-style model over 32 tokens.
MAZE_POLICY = DecoderConfig(
    name="maze_policy",
    vocab_size=32,
    hidden_size=256,
    intermediate_size=1024,
    num_layers=4,
    num_heads=4,
    num_kv_heads=2,
    rope_theta=1e6,
    rms_norm_eps=1e-6,
    tie_embeddings=True,
    max_position_embeddings=512,
)

SMOLLM2_135M = DecoderConfig(
    name="smollm2_135m",
    vocab_size=49152,
    hidden_size=576,
    intermediate_size=1536,
    num_layers=30,
    num_heads=9,
    num_kv_heads=3,
    rope_theta=100_000.0,
    rms_norm_eps=1e-5,
    tie_embeddings=True,
    max_position_embeddings=8192,
)

SMOLLM2_360M = DecoderConfig(
    name="smollm2_360m",
    vocab_size=49152,
    hidden_size=960,
    intermediate_size=2560,
    num_layers=32,
    num_heads=15,
    num_kv_heads=5,
    rope_theta=100_000.0,
    rms_norm_eps=1e-5,
    tie_embeddings=True,
    max_position_embeddings=8192,
)

QWEN25_MATH_1_5B = DecoderConfig(
    name="qwen2.5_math_1.5b",
    vocab_size=151936,
    hidden_size=1536,
    intermediate_size=8960,
    num_layers=28,
    num_heads=12,
    num_kv_heads=2,
    rope_theta=10_000.0,
    rms_norm_eps=1e-6,
    qkv_bias=True,
    tie_embeddings=True,
    max_position_embeddings=4096,
)

QWEN3_4B = DecoderConfig(
    name="qwen3_4b",
    vocab_size=151936,
    hidden_size=2560,
    intermediate_size=9728,
    num_layers=36,
    num_heads=32,
    num_kv_heads=8,
    head_dim=128,
    rope_theta=1_000_000.0,
    rms_norm_eps=1e-6,
    qk_norm=True,
    tie_embeddings=True,
    max_position_embeddings=40960,
)

CONFIGS: dict[str, DecoderConfig] = {
    c.name: c for c in (MAZE_POLICY, SMOLLM2_135M, SMOLLM2_360M, QWEN25_MATH_1_5B, QWEN3_4B)
}


def get_config(name: str, **overrides: Any) -> DecoderConfig:
    """A named preset, optionally with fields replaced (e.g. `dtype=jnp.bfloat16`)."""
    if name not in CONFIGS:
        raise ValueError(f"unknown decoder config name={name!r}; choose from {sorted(CONFIGS)}")
    return CONFIGS[name].replace(**overrides) if overrides else CONFIGS[name]


#: `model_type` values whose architecture this decoder implements.
SUPPORTED_MODEL_TYPES = ("llama", "qwen2", "qwen3", "mistral")


def _rope_theta(hf: Mapping[str, Any]) -> float:
    # transformers >= 5 nests RoPE settings in `rope_parameters`; older files use top-level
    # `rope_theta` / `rope_scaling`.
    params = hf.get("rope_parameters") or {}
    scaling = hf.get("rope_scaling") or {}
    for spec in (params, scaling):
        kind = spec.get("rope_type", spec.get("type", "default"))
        if kind not in ("default", None):
            raise ValueError(
                f"config.json rope type {kind!r} is not supported (only plain RoPE); "
                f"rope settings: {dict(spec)}"
            )
    return float(params.get("rope_theta", hf.get("rope_theta", 10_000.0)))


def from_hf_config(hf: Mapping[str, Any], **overrides: Any) -> DecoderConfig:
    """Convert a Hugging Face `config.json` dict (Llama / Qwen2 / Qwen3 / Mistral) to a config.

    Raises ValueError for another `model_type`, a non-SiLU activation, RoPE scaling, MLP
    bias or an active sliding window, none of which this decoder implements.
    """
    model_type = hf.get("model_type")
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ValueError(
            f"config.json model_type={model_type!r} is not supported; "
            f"supported: {SUPPORTED_MODEL_TYPES}"
        )
    act = hf.get("hidden_act", "silu")
    if act != "silu":
        raise ValueError(f"config.json hidden_act={act!r}; only 'silu' (SwiGLU) is supported")
    if hf.get("mlp_bias", False):
        raise ValueError("config.json mlp_bias=True is not supported")
    if hf.get("use_sliding_window", False) or (
        model_type == "mistral" and hf.get("sliding_window") is not None
    ):
        raise ValueError(
            "config.json enables sliding-window attention, which is not supported"
        )
    if model_type == "qwen2":
        qkv_bias = True  # Qwen2 always has q/k/v bias (no config switch)
    else:
        qkv_bias = bool(hf.get("attention_bias", False))
    num_heads = int(hf["num_attention_heads"])
    fields = dict(
        name=str(hf.get("_name_or_path", model_type)),
        vocab_size=int(hf["vocab_size"]),
        hidden_size=int(hf["hidden_size"]),
        intermediate_size=int(hf["intermediate_size"]),
        num_layers=int(hf["num_hidden_layers"]),
        num_heads=num_heads,
        num_kv_heads=int(hf.get("num_key_value_heads") or num_heads),
        head_dim=int(hf["head_dim"]) if hf.get("head_dim") else None,
        rope_theta=_rope_theta(hf),
        rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
        qkv_bias=qkv_bias,
        qk_norm=model_type == "qwen3",
        tie_embeddings=bool(hf.get("tie_word_embeddings", model_type != "llama")),
        max_position_embeddings=int(hf.get("max_position_embeddings", 4096)),
        initializer_range=float(hf.get("initializer_range", 0.02)),
    )
    fields.update(overrides)
    return DecoderConfig(**fields)


def to_hf_config(cfg: DecoderConfig, model_type: str | None = None) -> dict[str, Any]:
    """The Hugging Face `config.json` dict of `cfg` (float32; used to write test checkpoints).

    `model_type` defaults to "qwen3" with q/k norm, "qwen2" with bias, else "llama".
    """
    if model_type is None:
        model_type = "qwen3" if cfg.qk_norm else ("qwen2" if cfg.qkv_bias else "llama")
    if model_type == "qwen2" and not cfg.qkv_bias:
        raise ValueError("to_hf_config: model_type='qwen2' requires cfg.qkv_bias=True")
    if (model_type == "qwen3") != cfg.qk_norm:
        raise ValueError(
            f"to_hf_config: model_type={model_type!r} does not match qk_norm={cfg.qk_norm}"
        )
    arch = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM",
            "qwen3": "Qwen3ForCausalLM", "mistral": "MistralForCausalLM"}[model_type]
    return {
        "architectures": [arch],
        "model_type": model_type,
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "num_hidden_layers": cfg.num_layers,
        "num_attention_heads": cfg.num_heads,
        "num_key_value_heads": cfg.num_kv_heads,
        "head_dim": cfg.resolved_head_dim,
        "hidden_act": "silu",
        "rope_theta": cfg.rope_theta,
        "rms_norm_eps": cfg.rms_norm_eps,
        "attention_bias": cfg.qkv_bias,
        "mlp_bias": False,
        "tie_word_embeddings": cfg.tie_embeddings,
        "max_position_embeddings": cfg.max_position_embeddings,
        "initializer_range": cfg.initializer_range,
        "use_sliding_window": False,
        "torch_dtype": "float32",
    }
