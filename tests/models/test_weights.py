"""Weight import: HF safetensors (single file, sharded index, onto a mesh) and GGUF
(llama.cpp permutation, quantised tensors), against an independent NumPy forward."""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from safetensors.numpy import save_file

from sera_jax.models.configs import from_hf_config
from sera_jax.models.decoder import LOGICAL_AXIS_NAMES
from sera_jax.models.weights import (
    gguf_config,
    load_gguf,
    load_hf_checkpoint,
    load_hf_config,
    param_shardings,
    save_hf_checkpoint,
)
from sera_jax.sharding import make_mesh
from tests.models._reference import (
    random_hf_tensors,
    reference_logits,
    tiny_hf_config,
    write_hf_checkpoint,
)

TOKENS = np.array([3, 17, 5, 60, 22, 9, 41, 0, 33], np.int32)

_forward = nnx.jit(lambda m, t: m(t, jnp.arange(t.shape[1])[None])[0])


def logits_of(model, tokens=TOKENS):
    return np.asarray(_forward(model, jnp.asarray(tokens)[None]))[0]


@pytest.mark.parametrize("model_type,tied", [("llama", True), ("qwen2", False), ("qwen3", True)])
def test_hf_checkpoint_matches_numpy_reference(tmp_path, model_type, tied):
    cfg = tiny_hf_config(model_type, tied=tied)
    tensors = random_hf_tensors(cfg, seed=1)
    write_hf_checkpoint(tmp_path, cfg, tensors)
    model = load_hf_checkpoint(tmp_path)
    assert (model.cfg.qkv_bias, model.cfg.qk_norm, model.cfg.tie_embeddings) == (
        model_type == "qwen2", model_type == "qwen3", tied)
    want = reference_logits(cfg, tensors, TOKENS)
    np.testing.assert_allclose(logits_of(model), want, atol=2e-5, rtol=1e-5)

    # save -> load is the identity (bit-for-bit logits).
    save_hf_checkpoint(model, tmp_path / "again")
    again = load_hf_checkpoint(tmp_path / "again")
    np.testing.assert_array_equal(logits_of(again), logits_of(model))


def test_sharded_index_and_bfloat16_params(tmp_path):
    cfg = tiny_hf_config("qwen2", tied=False)
    tensors = random_hf_tensors(cfg, seed=2)
    names = sorted(tensors)
    halves = {"a.safetensors": names[::2], "b.safetensors": names[1::2]}
    for fname, part in halves.items():
        save_file({n: tensors[n] for n in part}, os.path.join(tmp_path, fname))
    index = {"weight_map": {n: f for f, part in halves.items() for n in part}}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    (tmp_path / "config.json").write_text(json.dumps(cfg))

    model = load_hf_checkpoint(tmp_path)
    np.testing.assert_allclose(logits_of(model), reference_logits(cfg, tensors, TOKENS),
                               atol=2e-5, rtol=1e-5)
    bf16 = load_hf_checkpoint(tmp_path, param_dtype=jnp.bfloat16)
    assert bf16.layers[0].attn.q_kernel[...].dtype == jnp.bfloat16


def test_load_onto_mesh(tmp_path):
    cfg = tiny_hf_config("llama", tied=False, num_attention_heads=4, num_key_value_heads=1)
    tensors = random_hf_tensors(cfg, seed=3)
    write_hf_checkpoint(tmp_path, cfg, tensors)
    mesh = make_mesh((2, 2, 2))
    model = load_hf_checkpoint(tmp_path, mesh=mesh)  # default: sharding.LOGICAL_RULES
    P = jax.sharding.PartitionSpec
    q = model.layers[1].attn.q_kernel[...]
    assert q.sharding.spec == P("fsdp", "tensor", None)
    assert q.addressable_shards[0].data.shape == (24, 2, 8)  # [48/2, 4/2, 8]
    assert model.layers[0].attn.k_kernel[...].sharding.spec == P("fsdp", None, None)  # 1 head
    assert model.embed[...].sharding.spec == P(None, "fsdp")  # 61 rows: replicated
    assert model.final_norm.scale[...].sharding.spec == P(None)
    np.testing.assert_allclose(logits_of(model), reference_logits(cfg, tensors, TOKENS),
                               atol=2e-5, rtol=1e-5)
    # Rules given as (name, axes) pairs; mapping nothing replicates everything.
    specs = param_shardings(model, mesh, [(n, None) for n in LOGICAL_AXIS_NAMES])
    assert all(s.spec == P(*([None] * len(s.spec))) for s in specs.values())


def test_hf_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_hf_checkpoint(tmp_path / "nope")
    with pytest.raises(FileNotFoundError, match="config.json"):
        load_hf_checkpoint(tmp_path)
    cfg = tiny_hf_config("llama")
    tensors = random_hf_tensors(cfg)
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(FileNotFoundError, match="safetensors"):
        load_hf_checkpoint(tmp_path)

    write_hf_checkpoint(tmp_path / "gpt2", {**cfg, "model_type": "gpt2"}, tensors)
    with pytest.raises(ValueError, match="model_type='gpt2'"):
        load_hf_checkpoint(tmp_path / "gpt2")

    wrong = {**cfg, "intermediate_size": 64}  # tensors have 80
    write_hf_checkpoint(tmp_path / "shape", wrong, tensors)
    with pytest.raises(ValueError, match=r"mlp.gate has shape \(48, 80\).*expects \(48, 64\)"):
        load_hf_checkpoint(tmp_path / "shape")

    fewer = {**cfg, "num_hidden_layers": 1}
    write_hf_checkpoint(tmp_path / "extra", fewer, tensors)
    with pytest.raises(ValueError, match="not used by the config"):
        load_hf_checkpoint(tmp_path / "extra")

    partial = {k: v for k, v in tensors.items() if "layers.1.mlp.up" not in k}
    write_hf_checkpoint(tmp_path / "missing", cfg, partial)
    with pytest.raises(ValueError, match="missing.*layers.1.mlp.up_proj"):
        load_hf_checkpoint(tmp_path / "missing")

    with pytest.raises(ValueError, match="rope type 'llama3'"):
        from_hf_config({**cfg, "rope_scaling": {"rope_type": "llama3", "factor": 8.0}})


# ---------------------------------------------------------------------------------------
# GGUF: written the way llama.cpp's convert_hf_to_gguf.py writes a Llama checkpoint.
# ---------------------------------------------------------------------------------------


def _llama_cpp_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    # convert_hf_to_gguf.LlamaModel.permute: rotate_half rows -> interleaved pairs per head.
    return (w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


_HF_TO_GGUF_BLOCK = {
    "input_layernorm.weight": "attn_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_proj.bias": "attn_q.bias",
    "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.bias": "attn_v.bias",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}


def _write_gguf(path, cfg, tensors, arch="llama", quantise=()):
    """A GGUF like llama.cpp's converter: metadata, renamed tensors, q/k permuted (llama).

    Tensors named in `quantise` are stored as Q8_0; returns the HF tensors as the loader
    should reconstruct them (quantised ones replaced by their dequantised values).
    """
    import gguf

    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_block_count(cfg["num_hidden_layers"])
    writer.add_context_length(cfg["max_position_embeddings"])
    writer.add_embedding_length(cfg["hidden_size"])
    writer.add_feed_forward_length(cfg["intermediate_size"])
    writer.add_head_count(cfg["num_attention_heads"])
    writer.add_head_count_kv(cfg["num_key_value_heads"])
    writer.add_key_length(cfg["head_dim"])
    writer.add_rope_freq_base(cfg["rope_theta"])
    writer.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    writer.add_vocab_size(cfg["vocab_size"])
    expected = {}
    for hf, w in tensors.items():
        if hf.startswith("model.layers."):
            i, rest = hf[len("model.layers."):].split(".", 1)
            name = f"blk.{i}.{_HF_TO_GGUF_BLOCK[rest]}"
        else:
            name = {"model.embed_tokens.weight": "token_embd.weight",
                    "model.norm.weight": "output_norm.weight",
                    "lm_head.weight": "output.weight"}[hf]
        data = w
        if arch == "llama" and "q_proj" in hf:
            data = _llama_cpp_permute(w, cfg["num_attention_heads"])
        elif arch == "llama" and "k_proj" in hf:
            data = _llama_cpp_permute(w, cfg["num_key_value_heads"])
        if hf in quantise:
            q8 = gguf.GGMLQuantizationType.Q8_0
            packed = gguf.quants.quantize(data, q8)
            writer.add_tensor(name, packed, raw_dtype=q8)
            expected[hf] = gguf.quants.dequantize(gguf.quants.quantize(w, q8), q8)
            assert not np.array_equal(expected[hf], w)  # quantisation really happened
        else:
            writer.add_tensor(name, data)
            expected[hf] = w
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return expected


def test_gguf_llama_round_trip_with_permutation_and_q8(tmp_path):
    cfg = tiny_hf_config("llama", tied=False, hidden_size=64, intermediate_size=96)
    tensors = random_hf_tensors(cfg, seed=4)
    quantise = {"model.layers.0.self_attn.q_proj.weight", "model.layers.1.mlp.up_proj.weight"}
    expected = _write_gguf(tmp_path / "m.gguf", cfg, tensors, quantise=quantise)
    parsed = gguf_config(tmp_path / "m.gguf")
    assert (parsed.num_layers, parsed.num_heads, parsed.num_kv_heads, parsed.head_dim,
            parsed.tie_embeddings, parsed.rope_theta) == (2, 6, 2, 8, False, 5000.0)
    model = load_gguf(tmp_path / "m.gguf")
    np.testing.assert_allclose(logits_of(model), reference_logits(cfg, expected, TOKENS),
                               atol=2e-5, rtol=1e-5)


def test_gguf_qwen2_has_bias_and_no_permutation(tmp_path):
    cfg = tiny_hf_config("qwen2", tied=True)
    tensors = random_hf_tensors(cfg, seed=5)
    _write_gguf(tmp_path / "q.gguf", cfg, tensors, arch="qwen2")
    model = load_gguf(tmp_path / "q.gguf")
    assert model.cfg.qkv_bias and model.cfg.tie_embeddings
    np.testing.assert_allclose(logits_of(model), reference_logits(cfg, tensors, TOKENS),
                               atol=2e-5, rtol=1e-5)


def test_scanned_layout_import_export_and_mesh(tmp_path):
    """scan_layers=True: HF and GGUF imports stack layer i into row i (equal to the unrolled
    import converted), logits match the NumPy reference, the stacked params land on their
    shardings with the layer axis unsplit, and the export is the per-layer file again."""
    from safetensors.numpy import load_file

    from sera_jax.models.decoder import convert_layout

    cfg = tiny_hf_config("qwen3", tied=False, num_hidden_layers=3)
    tensors = random_hf_tensors(cfg, seed=6)
    write_hf_checkpoint(tmp_path, cfg, tensors)
    mesh = make_mesh((2, 2, 2))
    scanned = load_hf_checkpoint(tmp_path, scan_layers=True, mesh=mesh)
    assert scanned.cfg.scan_layers
    q = scanned.layers.attn.q_kernel[...]
    assert q.shape == (3, 48, 6, 8)
    assert q.sharding.spec == jax.sharding.PartitionSpec(None, "fsdp", "tensor", None)
    want = reference_logits(cfg, tensors, TOKENS)
    np.testing.assert_allclose(logits_of(scanned), want, atol=2e-5, rtol=1e-5)
    converted = convert_layout(load_hf_checkpoint(tmp_path), scan_layers=True)
    for (path, a), (_, b) in zip(nnx.to_flat_state(nnx.state(scanned)),
                                 nnx.to_flat_state(nnx.state(converted))):
        np.testing.assert_array_equal(np.asarray(a.get_value()), np.asarray(b.get_value()),
                                      err_msg=str(path))

    save_hf_checkpoint(scanned, tmp_path / "again")
    again = load_file(tmp_path / "again" / "model.safetensors")
    assert again.keys() == tensors.keys()
    for name, w in tensors.items():
        np.testing.assert_array_equal(again[name], w, err_msg=name)

    gguf_cfg = tiny_hf_config("llama", tied=True, num_hidden_layers=3)
    gguf_tensors = random_hf_tensors(gguf_cfg, seed=7)
    _write_gguf(tmp_path / "m.gguf", gguf_cfg, gguf_tensors)
    from_gguf = load_gguf(tmp_path / "m.gguf", scan_layers=True)
    assert from_gguf.layers.mlp.up[...].shape == (3, 48, 80)
    np.testing.assert_allclose(logits_of(from_gguf),
                               reference_logits(gguf_cfg, gguf_tensors, TOKENS),
                               atol=2e-5, rtol=1e-5)


def test_gguf_errors(tmp_path):
    import gguf

    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_gguf(tmp_path / "none.gguf")
    writer = gguf.GGUFWriter(str(tmp_path / "gpt2.gguf"), "gpt2")
    writer.add_tensor("token_embd.weight", np.zeros((4, 8), np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(ValueError, match="architecture='gpt2' is not supported"):
        load_gguf(tmp_path / "gpt2.gguf")


# ---------------------------------------------------------------------------------------
# Bad files: one clear message naming the file and the fix (docs/robustness.md).
# ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def good_hf(tmp_path_factory):
    path = tmp_path_factory.mktemp("good_hf")
    cfg = tiny_hf_config("llama")
    tensors = random_hf_tensors(cfg, seed=7)
    write_hf_checkpoint(path, cfg, tensors)
    return path, cfg, tensors


def _copy(src, dst):
    import shutil

    shutil.copytree(src, dst)
    return dst


@pytest.mark.parametrize(
    ("content", "match"),
    [
        (b"{not json", r"config.json: not valid JSON \(line 1, column 2"),
        (b"", r"config.json: not valid JSON"),
        (b"[1, 2]", r"config.json: must hold a JSON object, got list"),
        (b'{"model_type": "llama", "hidden_size": "\xe9"}', r"config.json: not UTF-8 text"),
    ],
)
def test_malformed_config_json_names_the_file(tmp_path, good_hf, content, match):
    path = _copy(good_hf[0], tmp_path / "ckpt")
    (path / "config.json").write_bytes(content)
    with pytest.raises(ValueError, match=match):
        load_hf_checkpoint(path)


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"num_attention_heads": None}, "num_attention_heads=None is not a whole number"),
        ({"hidden_size": "48"}, "hidden_size='48' is not a whole number"),
        ({"num_hidden_layers": 2.5}, "num_hidden_layers=2.5 is not a whole number"),
        ({"vocab_size": True}, "vocab_size=True is not a whole number"),
        ({"head_dim": [8]}, r"head_dim=\[8\] is not a whole number"),
        ({"rope_theta": "1e4"}, "rope_theta='1e4' is not a number"),
        ({"rope_scaling": "linear"}, "rope_scaling='linear' is not an object"),
        ({"num_key_value_heads": 4}, r"config.json: .*num_kv_heads"),  # 6 heads % 4
        ({"model_type": None}, r"config.json: config.json model_type=None"),
    ],
)
def test_config_json_fields_of_the_wrong_kind(tmp_path, good_hf, change, match):
    _, cfg, _ = good_hf
    (tmp_path / "config.json").write_text(json.dumps({**cfg, **change}))
    with pytest.raises(ValueError, match=match) as e:
        load_hf_config(tmp_path)
    assert str(tmp_path / "config.json") in str(e.value)


def test_config_json_missing_fields_are_listed(tmp_path, good_hf):
    _, cfg, _ = good_hf
    partial = {k: v for k, v in cfg.items() if k not in ("hidden_size", "vocab_size")}
    (tmp_path / "config.json").write_text(json.dumps(partial))
    with pytest.raises(ValueError, match="vocab_size is missing; hidden_size is missing"):
        load_hf_config(tmp_path)


def test_unknown_overrides_are_named_not_blamed_on_the_file(good_hf):
    with pytest.raises(TypeError, match=r"unknown DecoderConfig field\(s\) \['param_dtyp'\]"):
        load_hf_config(good_hf[0], param_dtyp=jnp.bfloat16)


def _truncate(file, keep):
    with open(file, "r+b") as f:
        f.truncate(keep)


@pytest.mark.parametrize("damage", ["half", "header", "empty", "garbage", "flipped header"])
def test_truncated_or_garbage_safetensors_name_the_file(tmp_path, good_hf, damage):
    path = _copy(good_hf[0], tmp_path / "ckpt")
    st = path / "model.safetensors"
    size = os.path.getsize(st)
    if damage == "half":
        _truncate(st, size // 2)
    elif damage == "header":
        _truncate(st, 5)
    elif damage == "empty":
        _truncate(st, 0)
    elif damage == "garbage":
        st.write_bytes(np.random.default_rng(0).bytes(size))
    else:  # a corrupt header length
        data = bytearray(st.read_bytes())
        data[3] ^= 0x40
        st.write_bytes(bytes(data))
    with pytest.raises(ValueError) as e:
        load_hf_checkpoint(path)
    msg = str(e.value)
    assert str(st) in msg and "re-download" in msg, msg


@pytest.mark.parametrize(
    ("index", "match"),
    [
        ("{oops", r"index.json: not valid JSON"),
        ("[]", r"index.json: must hold a JSON object"),
        ("{}", r"index.json: has no 'weight_map'"),
        ('{"weight_map": [1, 2]}', r"'weight_map' must be an object"),
        ('{"weight_map": {"model.norm.weight": 3}}', r"'weight_map' must be an object"),
    ],
)
def test_malformed_safetensors_index(tmp_path, good_hf, index, match):
    path = _copy(good_hf[0], tmp_path / "ckpt")
    (path / "model.safetensors.index.json").write_text(index)
    with pytest.raises(ValueError, match=match):
        load_hf_checkpoint(path)


def test_index_naming_absent_files_or_tensors(tmp_path, good_hf):
    path = _copy(good_hf[0], tmp_path / "ckpt")
    names = list(good_hf[2])
    index = {"weight_map": {n: "model-00002-of-00002.safetensors" for n in names}}
    (path / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(FileNotFoundError, match=r"model-00002-of-00002.safetensors.*every shard"):
        load_hf_checkpoint(path)
    save_file({"other": np.zeros(2, np.float32)}, str(path / "other.safetensors"))
    index = {"weight_map": {n: "other.safetensors" for n in names}}
    (path / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(ValueError, match=r"other.safetensors: cannot read tensor"):
        load_hf_checkpoint(path)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("name", ["model.layers.1.mlp.up_proj.weight", "model.norm.weight"])
def test_nan_or_inf_weights_are_an_error_naming_the_tensor(tmp_path, good_hf, bad, name):
    _, cfg, tensors = good_hf
    broken = dict(tensors)
    broken[name] = tensors[name].copy()
    broken[name].reshape(-1)[3] = bad
    write_hf_checkpoint(tmp_path, cfg, broken)
    with pytest.raises(ValueError, match=rf"tensor {name} has 1 NaN/Inf value\(s\).*corrupt"):
        load_hf_checkpoint(tmp_path)


def test_weights_that_overflow_param_dtype_are_an_error(tmp_path, good_hf):
    _, cfg, tensors = good_hf
    big = dict(tensors)
    big["model.norm.weight"] = tensors["model.norm.weight"] * 0 + 1e6  # > float16 max
    write_hf_checkpoint(tmp_path, cfg, big)
    with pytest.raises(ValueError, match="overflow param_dtype=float16"):
        load_hf_checkpoint(tmp_path, param_dtype=jnp.float16)
    assert load_hf_checkpoint(tmp_path, param_dtype=jnp.bfloat16) is not None


def test_checkpoint_path_that_is_a_file(tmp_path, good_hf):
    with pytest.raises(FileNotFoundError, match="is a file; give the checkpoint directory"):
        load_hf_checkpoint(good_hf[0] / "config.json")


@pytest.fixture(scope="module")
def good_gguf(tmp_path_factory):
    path = tmp_path_factory.mktemp("good_gguf") / "m.gguf"
    cfg = tiny_hf_config("llama", tied=False, hidden_size=64, intermediate_size=96)
    tensors = random_hf_tensors(cfg, seed=4)
    _write_gguf(path, cfg, tensors)
    return path, cfg, tensors


@pytest.mark.parametrize("keep", [0.99, 0.9, 0.5, 0.1, 0.01, 20, 0])
def test_truncated_or_empty_gguf_names_the_file(tmp_path, good_gguf, keep):
    import shutil

    path = tmp_path / "t.gguf"
    shutil.copy(good_gguf[0], path)
    _truncate(path, int(os.path.getsize(path) * keep) if isinstance(keep, float) else keep)
    with pytest.raises(ValueError) as e:
        load_gguf(path)
    msg = str(e.value)
    assert str(path) in msg and "re-download" in msg, msg
    with pytest.raises(ValueError, match="re-download"):  # the tokenizer path opens it too
        from sera_jax.models.tokenizer import from_gguf

        from_gguf(path)


def test_garbage_gguf_names_the_file(tmp_path):
    path = tmp_path / "r.gguf"
    path.write_bytes(np.random.default_rng(0).bytes(4096))
    with pytest.raises(ValueError, match=r"r.gguf: not a readable GGUF file.*not GGUF"):
        load_gguf(path)


def test_gguf_nan_weights_are_an_error_naming_the_tensor(tmp_path, good_gguf):
    _, cfg, tensors = good_gguf
    broken = dict(tensors)
    broken["model.layers.0.mlp.down_proj.weight"] = tensors[
        "model.layers.0.mlp.down_proj.weight"].copy()
    broken["model.layers.0.mlp.down_proj.weight"][1, 2] = np.nan
    _write_gguf(tmp_path / "nan.gguf", cfg, broken)
    with pytest.raises(ValueError, match=r"tensor blk.0.ffn_down.weight has 1 NaN/Inf"):
        load_gguf(tmp_path / "nan.gguf")


def test_gguf_metadata_of_the_wrong_kind(tmp_path, good_gguf):
    import gguf

    _, cfg, tensors = good_gguf
    writer = gguf.GGUFWriter(str(tmp_path / "bad.gguf"), "llama")
    writer.add_string("llama.block_count", "two")
    writer.add_embedding_length(cfg["hidden_size"])
    writer.add_feed_forward_length(cfg["intermediate_size"])
    writer.add_head_count(cfg["num_attention_heads"])
    writer.add_tensor("token_embd.weight", tensors["model.embed_tokens.weight"])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(ValueError, match=r"bad.gguf: GGUF metadata llama.block_count='two' is "
                                         r"not of type int"):
        load_gguf(tmp_path / "bad.gguf")


# ---------------------------------------------- integrity: checksums where they exist


def _flip_data_byte(file):
    """XOR the lowest mantissa byte of a float32 near the middle of the tensor data: the
    value stays finite (the NaN / Inf check cannot see it)."""
    data = bytearray(open(file, "rb").read())
    start = 8 + int.from_bytes(data[:8], "little")  # safetensors: u64 header size, header
    offset = start + 4 * ((len(data) - start) // 8)
    data[offset] ^= 0x01
    open(file, "wb").write(bytes(data))


def _sha256(file):
    import hashlib

    return hashlib.sha256(open(file, "rb").read()).hexdigest()


def test_a_flipped_data_byte_is_caught_by_a_sha256_sidecar(tmp_path, good_hf):
    path = _copy(good_hf[0], tmp_path / "ckpt")
    st = path / "model.safetensors"
    (path / "model.safetensors.sha256").write_text(f"{_sha256(st)}  model.safetensors\n")
    load_hf_checkpoint(path)  # intact: verified and loaded
    _flip_data_byte(st)
    with pytest.raises(ValueError, match=r"model\.safetensors: sha256 [0-9a-f]{64} does not "
                       r"match .* from .*model\.safetensors\.sha256.*re-download"):
        load_hf_checkpoint(path)


def test_a_flipped_data_byte_is_caught_in_the_hub_cache(tmp_path, good_hf):
    """Hub layout: snapshots/<rev>/model.safetensors -> ../../blobs/<sha256>."""
    src = good_hf[0] / "model.safetensors"
    blobs, snap = tmp_path / "blobs", tmp_path / "snapshots" / "abc123"
    blobs.mkdir()
    snap.mkdir(parents=True)
    blob = blobs / _sha256(src)
    blob.write_bytes(src.read_bytes())
    (snap / "model.safetensors").symlink_to(os.path.relpath(blob, snap))
    (snap / "config.json").write_bytes((good_hf[0] / "config.json").read_bytes())
    load_hf_checkpoint(snap)
    _flip_data_byte(blob)
    with pytest.raises(ValueError, match=r"does not match .* from the hub cache blob name"):
        load_hf_checkpoint(snap)


def test_without_a_checksum_a_flipped_byte_loads_as_documented(tmp_path, good_hf):
    """The stated limit: safetensors carries no checksum; a finite flip is not detected."""
    from sera_jax.models import checksums, weights

    path = _copy(good_hf[0], tmp_path / "ckpt")
    _flip_data_byte(path / "model.safetensors")
    assert checksums.verify_file(path / "model.safetensors") is False
    load_hf_checkpoint(path)
    assert "NOT detected" in weights.load_hf_checkpoint.__doc__


def test_a_malformed_sidecar_is_named(tmp_path, good_hf):
    path = _copy(good_hf[0], tmp_path / "ckpt")
    (path / "model.safetensors.sha256").write_text("not-a-digest\n")
    with pytest.raises(ValueError, match=r"model\.safetensors\.sha256: not a sha256 checksum"):
        load_hf_checkpoint(path)


def test_a_gguf_with_a_sidecar_is_verified(tmp_path, good_gguf):
    import shutil

    path = tmp_path / "m.gguf"
    shutil.copy(good_gguf[0], path)
    (tmp_path / "m.gguf.sha256").write_text(_sha256(path))
    load_gguf(path)
    data = bytearray(path.read_bytes())
    data[-16] ^= 0x01  # tensor data sits at the end of the file
    path.write_bytes(bytes(data))
    with pytest.raises(ValueError, match=r"m\.gguf: sha256 .* does not match"):
        load_gguf(path)
