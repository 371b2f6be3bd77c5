"""Qwen2/Llama-family decoder, named configs, weight import (HF safetensors, GGUF), tokenizers."""

from sera_jax.models.decoder import (
    Decoder,
    DecoderConfig,
    KVCache,
    convert_layout,
    init_cache,
    positions_from_mask,
)
from sera_jax.models.logprobs import shared_prefix_logprobs, token_logprobs

__all__ = [
    "Decoder",
    "DecoderConfig",
    "KVCache",
    "convert_layout",
    "init_cache",
    "positions_from_mask",
    "shared_prefix_logprobs",
    "token_logprobs",
]
