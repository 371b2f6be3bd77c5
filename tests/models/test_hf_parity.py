"""Parity with the Hugging Face PyTorch implementations (needs `make hf-deps`).

Random weights are loaded into the transformers model (strict: our tensor names are HF's),
written with `save_pretrained`, read back with our loader, and the float32 logits of a
left-padded batch compared (≤ 1e-4 max abs).
"""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import jax.numpy as jnp  # noqa: E402
from flax import nnx  # noqa: E402

from sera_jax.models.decoder import positions_from_mask  # noqa: E402
from sera_jax.models.weights import load_hf_checkpoint  # noqa: E402
from tests.models._reference import random_hf_tensors, tiny_hf_config  # noqa: E402

pytestmark = pytest.mark.hf

CASES = {
    "qwen2_bias_untied": ("qwen2", False),
    "llama_tied": ("llama", True),
    "qwen3_qk_norm": ("qwen3", True),
}


def _hf_model(cfg_dict, tensors):
    model_type = cfg_dict["model_type"]
    kwargs = {k: v for k, v in cfg_dict.items()
              if k not in ("model_type", "architectures", "torch_dtype")}
    config = transformers.AutoConfig.for_model(model_type, **kwargs)
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config).float().eval()
    state = {k: torch.from_numpy(v) for k, v in tensors.items()}
    if cfg_dict["tie_word_embeddings"]:
        state["lm_head.weight"] = state["model.embed_tokens.weight"]
    missing, unexpected = model.load_state_dict(state, strict=False)
    assert not unexpected, unexpected
    assert not [m for m in missing if "rotary_emb" not in m], missing
    return model


@pytest.mark.parametrize("case", sorted(CASES))
def test_logits_match_transformers(tmp_path, case):
    model_type, tied = CASES[case]
    cfg = tiny_hf_config(model_type, tied=tied, vocab_size=96)
    tensors = random_hf_tensors(cfg, seed=7)
    hf = _hf_model(cfg, tensors)
    hf.save_pretrained(tmp_path, safe_serialization=True)
    ours = load_hf_checkpoint(tmp_path)

    rng = np.random.default_rng(0)
    lengths, width = [12, 7, 3], 12
    tokens = np.zeros((3, width), np.int64)
    mask = np.zeros((3, width), bool)
    for i, n in enumerate(lengths):  # left padding
        tokens[i, width - n:] = rng.integers(0, cfg["vocab_size"], n)
        mask[i, width - n:] = True
    positions = np.asarray(positions_from_mask(jnp.asarray(mask)))
    with torch.no_grad():
        want = hf(input_ids=torch.from_numpy(tokens),
                  attention_mask=torch.from_numpy(mask.astype(np.int64)),
                  position_ids=torch.from_numpy(positions.astype(np.int64))).logits.numpy()
    got = nnx.jit(lambda m, t, p, a: m(t, p, attention_mask=a)[0])(
        ours, jnp.asarray(tokens, jnp.int32), jnp.asarray(positions), jnp.asarray(mask))
    diff = np.abs(np.asarray(got) - want)[mask]
    print(f"{case}: max |logit diff| = {diff.max():.2e} (logit scale {np.abs(want).max():.1f})")
    assert diff.max() <= 1e-4


@pytest.mark.slow
def test_embedded_smollm2_matches_transformers_gguf_loader():
    """Our GGUF loader and tokenizer vs transformers' own GGUF readers on the embedded SmolLM2.

    transformers dequantises and un-permutes with its own code (`load_gguf_checkpoint`).
    """
    import os

    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    from sera_jax.models.embedded import load_smollm2, smollm2_gguf_path

    path = smollm2_gguf_path()
    ours, tok = load_smollm2()
    hf_tok = transformers.AutoTokenizer.from_pretrained(
        os.path.dirname(path), gguf_file=os.path.basename(path))
    texts = ["Hello world! In 2024, 3.14159 costs $12,345.",
             "  leading spaces\n\nnewlines\ttabs", "naïve café — “quotes” 日本語 😀",
             "<|im_start|>user\nHi<|im_end|>\n", "don't I'll we've THEY'RE"]
    for text in texts:
        assert tok.encode(text).tolist() == hf_tok.encode(text, add_special_tokens=False)

    config = load_gguf_checkpoint(path)["config"]
    model_type = config.pop("model_type")
    config.pop("_model_name_or_path", None)
    hf_config = transformers.AutoConfig.for_model(model_type, **config)
    hf_config._attn_implementation = "eager"
    hf = transformers.AutoModelForCausalLM.from_config(hf_config).float().eval()
    tensors = load_gguf_checkpoint(path, return_tensors=True, model_to_load=hf)["tensors"]
    state = {k: torch.as_tensor(np.asarray(v, np.float32)) for k, v in tensors.items()}
    state.setdefault("lm_head.weight", state["model.embed_tokens.weight"])
    hf.load_state_dict(state, strict=False)

    tokens = tok.encode("The quick brown fox jumps over the lazy dog near the river bank.")[None]
    with torch.no_grad():
        want = hf(input_ids=torch.from_numpy(tokens.astype(np.int64))).logits.numpy()
    got = np.asarray(nnx.jit(lambda m, t: m(t, jnp.arange(t.shape[1])[None])[0])(
        ours, jnp.asarray(tokens)))
    diff = np.abs(got - want).max()
    print(f"SmolLM2 GGUF: max |logit diff| vs transformers = {diff:.2e} "
          f"(logit scale {np.abs(want).max():.1f})")
    assert diff <= 1e-3
