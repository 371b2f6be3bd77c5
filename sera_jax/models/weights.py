"""Weight import/export: Hugging Face safetensors checkpoints and GGUF files.

Loading never materialises the whole model on the host: the model is built abstractly
(`nnx.eval_shape`), each parameter's target `NamedSharding` is resolved from its logical
axis names (`mesh` + flax logical-axis `rules`), and every tensor is read, converted to our
layout and placed with `jax.make_array_from_callback` one at a time (only the shards this
process addresses are transferred, so the same code runs on a multi-host pod). Partition
rules are those of `sera_jax.sharding` (the mesh must use `AxisType.Auto` axes, as
`sharding.make_mesh` builds it).

Layout conversion (HF `nn.Linear` weights are `[out, in]`):

    model.embed_tokens.weight [V, D]            -> embed [V, D]
    lm_head.weight [V, D]                       -> lm_head [D, V]            (untied only)
    *.q_proj.weight [H*Dh, D]                   -> attn.q_kernel [D, H, Dh]
    *.k_proj / v_proj.weight [Hkv*Dh, D]        -> attn.k_kernel / v_kernel [D, Hkv, Dh]
    *.o_proj.weight [D, H*Dh]                   -> attn.o_kernel [H, Dh, D]
    *.q/k/v_proj.bias [H*Dh]                    -> attn.q/k/v_bias [H, Dh]
    *.gate_proj / up_proj.weight [F, D]         -> mlp.gate / up [D, F]
    *.down_proj.weight [D, F]                   -> mlp.down [F, D]
    norms [D] / q_norm, k_norm [Dh]             -> *.scale

With `DecoderConfig.scan_layers` the per-layer tensors are stacked on import (layer i is row
i of `layers.<param>`) and written per layer again by `save_hf_checkpoint`; the files do
not depend on the layout.

GGUF files use the same `[out, in]` row layout under llama.cpp names; for the `llama`
architecture llama.cpp's converter permutes the rows of q/k within each head from the
"rotate_half" layout to interleaved pairs, which `_unpermute_rows` undoes.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import jax
import numpy as np
from flax import nnx
from safetensors import safe_open
from safetensors.numpy import save_file

from sera_jax import sharding as shd
from sera_jax.models import checksums
from sera_jax.models.configs import from_hf_config, to_hf_config
from sera_jax.models.decoder import Decoder, DecoderConfig, stacked_layer_path

Rules = Mapping[str, Any] | Sequence[tuple[str, Any]]

# ---------------------------------------------------------------------------------------
# Name and layout mapping (one table drives HF load, HF save and GGUF load).
# ---------------------------------------------------------------------------------------

_GGUF_TO_HF = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_GGUF_BLOCK_TO_HF = {
    "attn_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.bias": "self_attn.v_proj.bias",
    "attn_q_norm.weight": "self_attn.q_norm.weight",
    "attn_k_norm.weight": "self_attn.k_norm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}


def _param_table(cfg: DecoderConfig) -> list[tuple[str, tuple, Callable, Callable]]:
    """(hf_name, our_path, hf->ours, ours->hf) for every parameter of `cfg`; `our_path` is
    the unrolled-layout path (`("layers", i, ...)`; `decoder.stacked_layer_path` maps it to the
    `scan_layers` one)."""
    d, h, hkv, dh = cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.resolved_head_dim
    ident = (lambda w: w, lambda w: w)
    transpose = (lambda w: w.T, lambda w: w.T)

    def heads_in(n):  # [n*Dh, D] <-> [D, n, Dh]
        return (lambda w: w.T.reshape(d, n, dh), lambda w: w.reshape(d, n * dh).T)

    def heads_bias(n):  # [n*Dh] <-> [n, Dh]
        return (lambda w: w.reshape(n, dh), lambda w: w.reshape(n * dh))

    out_heads = (lambda w: w.T.reshape(h, dh, d), lambda w: w.reshape(h * dh, d).T)

    table = [("model.embed_tokens.weight", ("embed",), *ident),
             ("model.norm.weight", ("final_norm", "scale"), *ident)]
    if not cfg.tie_embeddings:
        table.append(("lm_head.weight", ("lm_head",), *transpose))
    for i in range(cfg.num_layers):
        p, a = f"model.layers.{i}.", ("layers", i, "attn")
        table += [
            (p + "input_layernorm.weight", ("layers", i, "attn_norm", "scale"), *ident),
            (p + "post_attention_layernorm.weight", ("layers", i, "mlp_norm", "scale"), *ident),
            (p + "self_attn.q_proj.weight", (*a, "q_kernel"), *heads_in(h)),
            (p + "self_attn.k_proj.weight", (*a, "k_kernel"), *heads_in(hkv)),
            (p + "self_attn.v_proj.weight", (*a, "v_kernel"), *heads_in(hkv)),
            (p + "self_attn.o_proj.weight", (*a, "o_kernel"), *out_heads),
            (p + "mlp.gate_proj.weight", ("layers", i, "mlp", "gate"), *transpose),
            (p + "mlp.up_proj.weight", ("layers", i, "mlp", "up"), *transpose),
            (p + "mlp.down_proj.weight", ("layers", i, "mlp", "down"), *transpose),
        ]
        if cfg.qkv_bias:
            table += [
                (p + "self_attn.q_proj.bias", (*a, "q_bias"), *heads_bias(h)),
                (p + "self_attn.k_proj.bias", (*a, "k_bias"), *heads_bias(hkv)),
                (p + "self_attn.v_proj.bias", (*a, "v_bias"), *heads_bias(hkv)),
            ]
        if cfg.qk_norm:
            table += [
                (p + "self_attn.q_norm.weight", (*a, "q_norm", "scale"), *ident),
                (p + "self_attn.k_norm.weight", (*a, "k_norm", "scale"), *ident),
            ]
    if cfg.scan_layers:
        # Parameter-major order (every layer's q_proj, then every layer's k_proj, ...): an
        # import then holds one stacked parameter on the host at a time (`_build`).
        kinds = {row[1][2:]: n for n, row in enumerate(table) if row[1][:2] == ("layers", 0)}
        table.sort(key=lambda row: (-1, 0) if row[1][0] != "layers" else (
            kinds[row[1][2:]], row[1][1]))
    return table


# Tensors a checkpoint may carry that this decoder does not use.
_IGNORABLE = re.compile(r"(^|\.)rotary_emb\.inv_freq$")


# ---------------------------------------------------------------------------------------
# Sharded placement.
# ---------------------------------------------------------------------------------------


def abstract_model(cfg: DecoderConfig) -> Decoder:
    """The model with `jax.ShapeDtypeStruct` leaves (no memory allocated)."""
    return nnx.eval_shape(lambda: Decoder(cfg, rngs=nnx.Rngs(0)))


def param_shardings(
    model: Decoder, mesh: jax.sharding.Mesh | None, rules: Rules | None = None
) -> dict[tuple, jax.sharding.Sharding | None]:
    """Target sharding of every parameter, keyed by its path in `nnx.state(model, nnx.Param)`.

    The logical names in each Param's `out_sharding` metadata map to mesh axes by `rules` (a
    mapping or `(name, axes)` pairs; default `sera_jax.sharding.LOGICAL_RULES`), through
    `sharding.state_shardings` (which replicates a dimension its axes do not divide).
    `mesh=None` gives None everywhere (default single-device placement).
    """
    state = nnx.state(model, nnx.Param)
    if mesh is None:
        return {path: None for path, _ in nnx.to_flat_state(state)}
    rules = shd.LOGICAL_RULES if rules is None else dict(rules)
    shardings = shd.state_shardings(state, mesh, rules)
    return {path: var.get_value() for path, var in nnx.to_flat_state(shardings)}


def _place(host: np.ndarray, sharding: jax.sharding.Sharding | None) -> jax.Array:
    if sharding is None:
        return jax.device_put(host)
    # Each addressable device receives only its slice; works with non-addressable devices.
    return jax.make_array_from_callback(host.shape, sharding, lambda idx: host[idx])


def _np_dtype(dtype: Any) -> np.dtype:
    return np.dtype(jax.numpy.dtype(dtype))  # accepts jnp.bfloat16 and strings too


def _check_finite(host: np.ndarray, converted: np.ndarray, tensor: str, source: str,
                  target: np.dtype) -> None:
    """NaN / Inf in a loaded weight is an error naming the tensor (never a silent model)."""
    if not jax.numpy.issubdtype(converted.dtype, jax.numpy.inexact):
        return
    finite = np.isfinite(converted)
    if finite.all():
        return
    bad = int(finite.size - np.count_nonzero(finite))
    if np.isfinite(np.asarray(host, np.float32)).all():
        why = (f"its values overflow param_dtype={target.name} (largest |w| = "
               f"{float(np.abs(np.asarray(host, np.float32)).max()):.4g}); load with a wider "
               "param_dtype (float32 / bfloat16)")
    else:
        why = ("the file holds them: it is corrupt, or was saved from a diverged model; "
               "re-download or re-export it")
    raise ValueError(
        f"{source}: tensor {tensor} has {bad} NaN/Inf value(s) of {finite.size}: {why}"
    )


def _build(
    cfg: DecoderConfig,
    tensors: Iterator[tuple[tuple, np.ndarray, str]],
    mesh: jax.sharding.Mesh | None,
    rules: Rules | None,
    source: str,
) -> Decoder:
    """Fill an abstract model from `(our_path, host_array, file tensor name)` triples, one
    tensor at a time (`our_path` in the unrolled layout, `_param_table`'s). Raises
    ValueError for a shape mismatch, NaN / Inf values or missing parameters.

    With `cfg.scan_layers` each layer's tensor is copied into a host buffer of the stacked
    parameter, which is placed once its L layers are in (`_param_table` orders the tensors
    so that one stacked parameter is buffered at a time)."""
    model = abstract_model(cfg)
    shardings = param_shardings(model, mesh, rules)
    state = nnx.state(model, nnx.Param)
    flat = dict(nnx.to_flat_state(state))
    filled = set()
    target = _np_dtype(cfg.param_dtype)
    stacks: dict[tuple, tuple[np.ndarray, set]] = {}  # stacked path -> (buffer, layers in)
    for table_path, host, tensor in tensors:
        path, layer = stacked_layer_path(cfg, table_path)
        var = flat[path]
        expected = tuple(var.get_value().shape)
        expected = expected if layer is None else expected[1:]
        if tuple(host.shape) != expected:
            name = ".".join(map(str, table_path))
            raise ValueError(
                f"{source}: parameter {name} has shape {tuple(host.shape)} after layout "
                f"conversion, but the config expects {expected}; the checkpoint does not "
                "match the config"
            )
        with np.errstate(over="ignore"):  # an overflow is reported just below
            converted = np.ascontiguousarray(host.astype(target))
        _check_finite(host, converted, tensor, source, target)
        if layer is not None:
            buffer, layers_in = stacks.setdefault(
                path, (np.empty((cfg.num_layers, *expected), target), set()))
            buffer[layer] = converted
            layers_in.add(layer)
            if len(layers_in) < cfg.num_layers:
                continue
            converted = stacks.pop(path)[0]
        var.set_value(_place(converted, shardings[path]))
        filled.add(path)
    missing = set(flat) - filled
    if missing:
        names = sorted(".".join(map(str, p)) for p in missing)
        raise ValueError(f"{source}: parameters not found in the checkpoint: {names[:8]}")
    nnx.update(model, state)
    return model


# ---------------------------------------------------------------------------------------
# Hugging Face safetensors.
# ---------------------------------------------------------------------------------------


def _read_json_object(file: str, fix: str) -> dict[str, Any]:
    """A JSON object from `file`, or ValueError naming the file, the position and `fix`."""
    try:
        with open(file, "rb") as f:
            text = f.read().decode("utf-8")
        value = json.loads(text)
    except UnicodeDecodeError as e:
        raise ValueError(f"{file}: not UTF-8 text (byte {e.start}); {fix}") from e
    except json.JSONDecodeError as e:
        raise ValueError(
            f"{file}: not valid JSON (line {e.lineno}, column {e.colno}: {e.msg}); {fix}"
        ) from e
    if not isinstance(value, dict):
        raise ValueError(f"{file}: must hold a JSON object, got {type(value).__name__}; {fix}")
    return value


# config.json fields the conversion reads, with the kind of value each must hold.
_HF_INT_FIELDS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                  "num_attention_heads")
_HF_OPTIONAL_INT_FIELDS = ("num_key_value_heads", "head_dim", "max_position_embeddings")
_HF_FLOAT_FIELDS = ("rope_theta", "rms_norm_eps", "initializer_range")


def _check_hf_config(hf: Mapping[str, Any], file: str) -> None:
    """Every field `from_hf_config` converts has the right kind of value (else one message
    naming the field, instead of a KeyError / TypeError from deep inside)."""

    def whole(v):
        return (isinstance(v, int) and not isinstance(v, bool)) or (
            isinstance(v, float) and v.is_integer())

    problems = [f"{k} is missing" for k in _HF_INT_FIELDS if k not in hf]
    problems += [f"{k}={hf[k]!r} is not a whole number" for k in _HF_INT_FIELDS
                 if k in hf and not whole(hf[k])]
    problems += [f"{k}={hf[k]!r} is not a whole number" for k in _HF_OPTIONAL_INT_FIELDS
                 if hf.get(k) is not None and not whole(hf[k])]
    problems += [f"{k}={hf[k]!r} is not a number" for k in _HF_FLOAT_FIELDS
                 if hf.get(k) is not None and (isinstance(hf[k], bool)
                                               or not isinstance(hf[k], int | float))]
    for key in ("rope_parameters", "rope_scaling"):
        if hf.get(key) is not None and not isinstance(hf[key], dict):
            problems.append(f"{key}={hf[key]!r} is not an object")
    if problems:
        raise ValueError(
            f"{file}: {'; '.join(problems)}. Fix: use the config.json that came with the "
            "weights (a Llama / Qwen2 / Qwen3 / Mistral checkpoint)"
        )


def load_hf_config(path: str | os.PathLike, **overrides: Any) -> DecoderConfig:
    """`DecoderConfig` from `path/config.json` (fields in `overrides` replace parsed ones).

    Raises FileNotFoundError without a config.json, ValueError naming the file for one that
    is not a JSON object, lacks a field or holds a value of the wrong kind."""
    cfg_file = os.path.join(path, "config.json")
    if not os.path.isfile(cfg_file):
        raise FileNotFoundError(
            f"no config.json in {os.fspath(path)!r}; expected a Hugging Face checkpoint "
            "directory (config.json + *.safetensors)"
        )
    unknown = sorted(set(overrides) - {f.name for f in dataclasses.fields(DecoderConfig)})
    if unknown:
        raise TypeError(f"unknown DecoderConfig field(s) {unknown} in the overrides")
    hf = _read_json_object(cfg_file, "re-download the checkpoint's config.json")
    _check_hf_config(hf, cfg_file)
    try:
        return from_hf_config(hf, **overrides)
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f"{cfg_file}: {e}") from e


def _open_safetensors(file: str):
    """`safe_open(file)`, or ValueError naming the file for a truncated / garbage one."""
    try:
        return safe_open(file, framework="numpy")
    except FileNotFoundError:
        raise
    except Exception as e:  # noqa: BLE001 -- SafetensorError and friends carry no path
        size = os.path.getsize(file) if os.path.exists(file) else 0
        raise ValueError(
            f"{file}: not a readable safetensors file ({type(e).__name__}: {e}; {size} "
            "bytes): it is truncated or corrupt. Fix: re-download it (compare its size / "
            "sha256 with the hub's)"
        ) from e


def _safetensors_index(path: str) -> dict[str, str]:
    """Tensor name -> file, from `model.safetensors.index.json` or every `*.safetensors`."""
    index_file = os.path.join(path, "model.safetensors.index.json")
    if os.path.isfile(index_file):
        fix = "re-download the checkpoint's model.safetensors.index.json"
        index_json = _read_json_object(index_file, fix)
        if "weight_map" not in index_json:
            raise ValueError(f"{index_file}: has no 'weight_map' (tensor name -> file "
                             f"name); {fix}")
        weight_map = index_json["weight_map"]
        if not isinstance(weight_map, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in weight_map.items()
        ):
            raise ValueError(
                f"{index_file}: 'weight_map' must be an object of tensor name -> file name, "
                f"got {str(weight_map)[:80]!r}; {fix}"
            )
        missing = sorted({f for f in weight_map.values()
                          if not os.path.isfile(os.path.join(path, f))})
        if missing:
            raise FileNotFoundError(
                f"{index_file} names weight files that are not in {path!r}: {missing[:4]}; "
                "download every shard of the checkpoint"
            )
        return {name: os.path.join(path, fname) for name, fname in weight_map.items()}
    files = sorted(f for f in os.listdir(path) if f.endswith(".safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors files in {path!r}")
    index = {}
    for fname in files:
        with _open_safetensors(os.path.join(path, fname)) as f:
            for name in f.keys():
                index[name] = os.path.join(path, fname)
    return index


def load_hf_checkpoint(
    path: str | os.PathLike,
    *,
    cfg: DecoderConfig | None = None,
    mesh: jax.sharding.Mesh | None = None,
    rules: Rules | None = None,
    **overrides: Any,
) -> Decoder:
    """Load a Hugging Face Llama/Qwen2/Qwen3 checkpoint directory into a `Decoder`.

    `cfg` defaults to `load_hf_config(path, **overrides)` (pass e.g. `param_dtype=jnp.bfloat16`
    through `overrides`). With `mesh`, each parameter lands directly on the NamedSharding its
    logical axes map to under `rules`. Raises FileNotFoundError for a missing config or
    weights, ValueError for an unsupported architecture, missing/unexpected tensors, a
    shape mismatch, NaN / Inf, or a file that does not match its checksum.

    Integrity: each weight file is checked against its SHA-256 where one exists (a
    `<file>.sha256` sidecar, or the hub cache's blob name; `sera_jax.models.checksums`).
    Safetensors and the index carry no checksum: without one, a flipped data byte that
    stays finite is NOT detected (only NaN / Inf are).
    """
    path = os.fspath(path)
    if not os.path.isdir(path):
        if os.path.exists(path):
            raise FileNotFoundError(
                f"{path!r} is a file; give the checkpoint directory (config.json + "
                "*.safetensors)")
        raise FileNotFoundError(f"checkpoint directory {path!r} does not exist")
    if cfg is None:
        cfg = load_hf_config(path, **overrides)
    elif overrides:
        cfg = cfg.replace(**overrides)
    index = _safetensors_index(path)
    for file in sorted(set(index.values())):
        checksums.verify_file(file)  # where a checksum exists; see the docstring
    table = _param_table(cfg)
    used = {hf for hf, *_ in table}
    unexpected = sorted(
        n for n in index
        if n not in used and not _IGNORABLE.search(n)
        and not (cfg.tie_embeddings and n == "lm_head.weight")
    )
    if unexpected:
        raise ValueError(
            f"{path}: tensors {unexpected[:8]} (of {len(unexpected)}) are not used by the "
            f"config (layers={cfg.num_layers}, qkv_bias={cfg.qkv_bias}, "
            f"qk_norm={cfg.qk_norm}, tied={cfg.tie_embeddings}); wrong config?"
        )
    missing = sorted(hf for hf in used if hf not in index)
    if missing:
        raise ValueError(f"{path}: tensors missing from the checkpoint: {missing[:8]}")

    def tensors():
        handles: dict[str, Any] = {}
        try:
            for hf, ours, to_ours, _ in table:
                fname = index[hf]
                if fname not in handles:
                    handles[fname] = _open_safetensors(fname).__enter__()
                try:
                    host = handles[fname].get_tensor(hf)
                except Exception as e:  # noqa: BLE001 -- SafetensorError carries no path
                    raise ValueError(
                        f"{fname}: cannot read tensor {hf!r} ({type(e).__name__}: {e}); the "
                        "file is corrupt or does not hold what the index says. Fix: "
                        "re-download the checkpoint"
                    ) from e
                yield ours, to_ours(host), hf
        finally:
            for h in handles.values():
                h.__exit__(None, None, None)

    return _build(cfg, tensors(), mesh, rules, source=path)


def save_hf_checkpoint(
    model: Decoder,
    path: str | os.PathLike,
    *,
    model_type: str | None = None,
    dtype: Any = np.float32,
) -> None:
    """Write `model` as a Hugging Face checkpoint directory (config.json + model.safetensors).

    Gathers every parameter to the host; meant for small models and tests. A `scan_layers`
    model is written per layer (`model.layers.{i}.*`), like an unrolled one.
    """
    path = os.fspath(path)
    os.makedirs(path, exist_ok=True)
    cfg = model.cfg
    flat = dict(nnx.to_flat_state(nnx.state(model, nnx.Param)))
    np_dtype = _np_dtype(dtype)
    host: dict[tuple, np.ndarray] = {}  # one transfer per (stacked) parameter

    def ours_on_host(table_path):
        path, layer = stacked_layer_path(cfg, table_path)
        if path not in host:
            host[path] = np.asarray(flat[path].get_value())
        return host[path] if layer is None else host[path][layer]

    tensors = {
        hf: np.ascontiguousarray(to_hf(ours_on_host(ours)).astype(np_dtype))
        for hf, ours, _, to_hf in _param_table(cfg)
    }
    save_file(tensors, os.path.join(path, "model.safetensors"))
    hf_cfg = to_hf_config(cfg, model_type)
    hf_cfg["torch_dtype"] = {"float32": "float32", "bfloat16": "bfloat16",
                             "float16": "float16"}[np_dtype.name]
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(hf_cfg, f, indent=2)


# ---------------------------------------------------------------------------------------
# GGUF.
# ---------------------------------------------------------------------------------------

#: GGUF `general.architecture` values this loader maps onto the decoder.
GGUF_ARCHITECTURES = ("llama", "qwen2", "qwen3")


def _unpermute_rows(w: np.ndarray, n_head: int) -> np.ndarray:
    """Undo llama.cpp's q/k `permute` (its rotary kernel pairs adjacent rows).

    llama.cpp's converter reorders each head's rows from the rotate_half layout
    (x_0..x_{Dh/2-1} | x_{Dh/2}..x_{Dh-1}) to interleaved pairs (x_0, x_{Dh/2}, x_1, ...) via
    `reshape(n_head, 2, Dh/2, ...).swapaxes(1, 2)`; the inverse reshapes as
    `(n_head, Dh/2, 2, ...)` and swaps back.
    """
    rows = w.shape[0]
    half = rows // n_head // 2
    return w.reshape(n_head, half, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _gguf_value(reader, key: str, default: Any = None) -> Any:
    field = reader.fields.get(key)
    return default if field is None else field.contents()


def open_gguf(source):
    """A `gguf.GGUFReader` for a path (a reader passes through; parsing a large vocabulary
    takes seconds, so callers that need model and tokenizer share one).

    GGUF has no checksum: a `<file>.sha256` sidecar or a hub-cache blob name is verified
    (`sera_jax.models.checksums`); without one a flipped data byte that stays finite is
    not detected (NaN / Inf are, by `load_gguf`)."""
    import gguf  # imported lazily: only GGUF users need it

    if isinstance(source, gguf.GGUFReader):
        return source
    path = os.fspath(source)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"GGUF file {path!r} does not exist")
    size = os.path.getsize(path)
    fix = "Fix: re-download it (compare its size / sha256 with the source's) or re-convert it"
    if size == 0:
        raise ValueError(f"{path}: the GGUF file is empty (0 bytes). {fix}")
    checksums.verify_file(path)
    try:
        return gguf.GGUFReader(path)
    except Exception as e:  # noqa: BLE001 -- IndexError / reshape ValueError / KeyError ...
        raise ValueError(
            f"{path}: not a readable GGUF file ({type(e).__name__}: {e}; {size} bytes): it is "
            f"truncated, corrupt or not GGUF. {fix}"
        ) from e


def _open_gguf(source):
    reader = open_gguf(source)
    path = os.fspath(reader.data.filename)
    arch = _gguf_value(reader, "general.architecture")
    if arch not in GGUF_ARCHITECTURES:
        raise ValueError(
            f"{path}: GGUF general.architecture={arch!r} is not supported; "
            f"supported: {GGUF_ARCHITECTURES}"
        )
    return reader, arch, path


def gguf_config(source, **overrides: Any) -> DecoderConfig:
    """`DecoderConfig` from a GGUF file's metadata (`source`: path or `gguf.GGUFReader`)."""
    reader, arch, path = _open_gguf(source)
    return _gguf_config(reader, arch, path, overrides)


def _gguf_config(reader, arch: str, path: str, overrides: Mapping[str, Any]) -> DecoderConfig:
    def get(key, default=None, kind=int):
        value = _gguf_value(reader, f"{arch}.{key}", default)
        if value is None:
            raise ValueError(f"{path}: GGUF metadata {arch}.{key} is missing")
        try:
            return kind(value)
        except (TypeError, ValueError) as e:
            raise ValueError(
                f"{path}: GGUF metadata {arch}.{key}={value!r} is not of type {kind.__name__}; the "
                "file is corrupt or was not written by llama.cpp's converter"
            ) from e

    scaling = _gguf_value(reader, f"{arch}.rope.scaling.type", "none")
    if scaling not in ("none", None):
        raise ValueError(f"{path}: GGUF rope scaling {scaling!r} is not supported")
    names = {t.name for t in reader.tensors}
    embd = next((t for t in reader.tensors if t.name == "token_embd.weight"), None)
    if embd is None:
        raise ValueError(f"{path}: GGUF has no token_embd.weight tensor")
    num_heads = get("attention.head_count")
    hidden = get("embedding_length")
    if num_heads < 1:
        raise ValueError(f"{path}: GGUF metadata {arch}.attention.head_count={num_heads}")
    fields = dict(
        name=str(_gguf_value(reader, "general.name", arch)),
        vocab_size=get("vocab_size", int(embd.shape[1])),
        hidden_size=hidden,
        intermediate_size=get("feed_forward_length"),
        num_layers=get("block_count"),
        num_heads=num_heads,
        num_kv_heads=get("attention.head_count_kv", num_heads),
        head_dim=get("attention.key_length", hidden // num_heads),
        rope_theta=get("rope.freq_base", 10_000.0, float),
        rms_norm_eps=get("attention.layer_norm_rms_epsilon", kind=float),
        qkv_bias="blk.0.attn_q.bias" in names,
        qk_norm="blk.0.attn_q_norm.weight" in names,
        tie_embeddings="output.weight" not in names,
        max_position_embeddings=get("context_length", 4096),
    )
    fields.update(overrides)
    return DecoderConfig(**fields)


def _gguf_to_hf_name(name: str) -> str | None:
    if name in _GGUF_TO_HF:
        return _GGUF_TO_HF[name]
    m = re.fullmatch(r"blk\.(\d+)\.(.+)", name)
    if m and m.group(2) in _GGUF_BLOCK_TO_HF:
        return f"model.layers.{m.group(1)}.{_GGUF_BLOCK_TO_HF[m.group(2)]}"
    return None


def load_gguf(
    source,
    *,
    mesh: jax.sharding.Mesh | None = None,
    rules: Rules | None = None,
    **overrides: Any,
) -> Decoder:
    """Load a GGUF file (llama / qwen2 / qwen3 architecture), dequantising every tensor.

    `source` is a path or a `gguf.GGUFReader`. Quantised tensors go through
    `gguf.quants.dequantize` to float32, then to `cfg.param_dtype`; for `llama` the q/k row
    permutation of llama.cpp is undone.
    """
    from gguf.quants import dequantize

    reader, arch, path = _open_gguf(source)
    cfg = _gguf_config(reader, arch, path, overrides)
    by_hf = {}
    for t in reader.tensors:
        hf = _gguf_to_hf_name(t.name)
        if hf is None:
            if t.name in ("rope_freqs.weight",):
                continue
            raise ValueError(f"{path}: unexpected GGUF tensor {t.name!r}")
        by_hf[hf] = t
    table = _param_table(cfg)
    missing = [hf for hf, *_ in table if hf not in by_hf]
    if missing:
        raise ValueError(f"{path}: GGUF tensors missing for {missing[:8]}")

    def tensors():
        for hf, ours, to_ours, _ in table:
            t = by_hf[hf]
            expected = tuple(int(n) for n in reversed(t.shape))  # ggml lists dims fastest-first
            try:
                w = dequantize(t.data, t.tensor_type).reshape(expected)
            except NotImplementedError as e:
                raise ValueError(
                    f"{path}: tensor {t.name!r} has GGML type {t.tensor_type.name}, which "
                    "gguf cannot dequantise; re-quantise the model to another type"
                ) from e
            except ValueError as e:
                raise ValueError(
                    f"{path}: tensor {t.name!r} ({t.tensor_type.name}, shape {expected}) is "
                    f"unreadable ({e}): the file is truncated or corrupt. Fix: re-download "
                    "or re-convert it"
                ) from e
            if arch == "llama" and hf.endswith(("q_proj.weight", "q_proj.bias")):
                w = _unpermute_rows(w, cfg.num_heads)
            elif arch == "llama" and hf.endswith(("k_proj.weight", "k_proj.bias")):
                w = _unpermute_rows(w, cfg.num_kv_heads)
            yield ours, to_ours(w), t.name

    return _build(cfg, tensors(), mesh, rules, source=path)


__all__ = [
    "GGUF_ARCHITECTURES",
    "abstract_model",
    "gguf_config",
    "load_gguf",
    "load_hf_checkpoint",
    "load_hf_config",
    "open_gguf",
    "param_shardings",
    "save_hf_checkpoint",
]
