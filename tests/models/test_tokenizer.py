"""Tokenizers: rebuilt from GGUF metadata == the original, tokenizer.json dirs, ChatML."""

import json

import gguf
import numpy as np
import pytest
import tokenizers
from tokenizers import decoders, models, pre_tokenizers, trainers

from sera_jax.models.tokenizer import from_gguf, from_pretrained_dir, load_tokenizer

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CORPUS = [
    "The quick brown fox jumps over the lazy dog. It's 2024 and we're testing 12345 tokens.",
    "Byte-level BPE handles unicode: naïve café, Ελληνικά, 日本語 and emoji 😀 too!",
    "  Leading spaces,\ttabs\nand new lines\n\nmatter. Don't they? I'll see; you've been.",
] * 20
TEXTS = [
    "The lazy fox, in 2024, paid $12,345.67 for 3 dogs.",
    "  spaces\tand\ttabs\n\n",
    "unicode naïve 日本 😀 Ελ",
    "<|im_start|>user\nhello<|im_end|>\n",
    "we're THEY'RE don't",
]
SYSTEM = "You are a tiny test model"
TEMPLATE = ("{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
            "{{ '<|im_start|>system\n" + SYSTEM + "<|im_end|>\n' }}{% endif %}"
            "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>'}}"
            "{% endfor %}")


@pytest.fixture(scope="module")
def original():
    """A small SmolLM2-style tokenizer: single digits + GPT-2 byte-level BPE."""
    tok = tokenizers.Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS, trainer)
    return tok


def _write_gguf(path, tok, pre="smollm", model="gpt2"):
    data = json.loads(tok.to_str())
    vocab = data["model"]["vocab"]
    tokens = [None] * len(vocab)
    for t, i in vocab.items():
        tokens[i] = t
    merges = [m if isinstance(m, str) else " ".join(m) for m in data["model"]["merges"]]
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_tokenizer_model(model)
    writer.add_tokenizer_pre(pre)
    writer.add_token_list(tokens)
    writer.add_token_merges(merges)
    writer.add_token_types([gguf.TokenType.CONTROL if t in SPECIALS else gguf.TokenType.NORMAL
                            for t in tokens])
    writer.add_bos_token_id(vocab["<|im_start|>"])
    writer.add_eos_token_id(vocab["<|im_end|>"])
    writer.add_pad_token_id(vocab["<|im_end|>"])
    writer.add_chat_template(TEMPLATE)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def test_gguf_rebuild_matches_original(tmp_path, original):
    _write_gguf(tmp_path / "t.gguf", original)
    tok = load_tokenizer(tmp_path / "t.gguf")
    for text in TEXTS:
        want = original.encode(text, add_special_tokens=False).ids
        assert tok.encode(text).tolist() == want, text
        assert tok.decode(tok.encode(text)) == text
    assert len(tok.encode("12345")) == 5  # digits are split one by one
    vocab = original.get_vocab()
    assert tok.eos_id == vocab["<|im_end|>"] and tok.bos_id == vocab["<|im_start|>"]
    assert tok.stop_ids == tuple(sorted({vocab["<|im_end|>"], vocab["<|endoftext|>"]}))
    assert tok.default_system == SYSTEM
    assert tok.vocab_size == original.get_vocab_size()


def test_chat_prompt(tmp_path, original):
    _write_gguf(tmp_path / "t.gguf", original)
    tok = from_gguf(tmp_path / "t.gguf")
    assert tok.chat_prompt("Hi there") == (
        f"<|im_start|>system\n{SYSTEM}<|im_end|>\n"
        "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n")
    assert tok.chat_prompt("Q", system="S", add_generation_prompt=False) == (
        "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nQ<|im_end|>\n")
    ids = tok.encode_chat("Hi", system="S")
    assert ids[0] == tok.token_id("<|im_start|>")
    assert (ids == tok.token_id("<|im_end|>")).sum() == 2  # specials are single tokens
    assert tok.decode(ids) == tok.chat_prompt("Hi", system="S")
    assert tok.decode(ids, skip_special_tokens=True) == "system\nS\nuser\nHi\nassistant\n"
    with pytest.raises(ValueError, match="not in the vocabulary"):
        tok.token_id("<|nope|>")


def test_tokenizer_json_directory(tmp_path, original):
    original.add_special_tokens(SPECIALS)
    original.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({
        "eos_token": "<|im_end|>", "pad_token": {"content": "<|endoftext|>"},
        "chat_template": TEMPLATE}))
    tok = load_tokenizer(tmp_path)
    vocab = original.get_vocab()
    assert (tok.eos_id, tok.pad_id, tok.bos_id) == (
        vocab["<|im_end|>"], vocab["<|endoftext|>"], None)
    assert tok.default_system == SYSTEM
    batch = tok.encode_batch(TEXTS)
    for text, ids in zip(TEXTS, batch):
        assert ids.dtype == np.int32
        assert ids.tolist() == original.encode(text, add_special_tokens=False).ids
    # Without tokenizer_config.json the eos falls back to <|im_end|>.
    (tmp_path / "tokenizer_config.json").unlink()
    assert from_pretrained_dir(tmp_path).eos_id == vocab["<|im_end|>"]


def test_tokenizer_errors(tmp_path, original):
    with pytest.raises(FileNotFoundError, match="tokenizer.json"):
        load_tokenizer(tmp_path)
    with pytest.raises(FileNotFoundError, match="neither"):
        load_tokenizer(tmp_path / "missing.bin")
    _write_gguf(tmp_path / "spm.gguf", original, model="llama")
    with pytest.raises(ValueError, match="tokenizer.ggml.model='llama'"):
        from_gguf(tmp_path / "spm.gguf")


# ---------------------------------------------------------------------------------------
# Bad files: one clear message naming the file and the fix (docs/robustness.md).
# ---------------------------------------------------------------------------------------


def _tokenizer_dir(path, original, config=None):
    original.add_special_tokens(SPECIALS)
    original.save(str(path / "tokenizer.json"))
    if config is not None:
        (path / "tokenizer_config.json").write_text(
            config if isinstance(config, str) else json.dumps(config))
    return path


@pytest.mark.parametrize("content", ['{"model": ', "", "[1, 2]", '{"version": "1.0"}'])
def test_corrupt_tokenizer_json_names_the_file(tmp_path, original, content):
    _tokenizer_dir(tmp_path, original)
    (tmp_path / "tokenizer.json").write_text(content)
    with pytest.raises(ValueError, match=r"tokenizer.json: not a readable tokenizer.json.*"
                                         r"re-download"):
        load_tokenizer(tmp_path)


@pytest.mark.parametrize(
    ("config", "match"),
    [
        ("{oops", r"tokenizer_config.json: not valid JSON \(line 1"),
        ("[]", "tokenizer_config.json: must hold a JSON object, got list"),
        ({"eos_token": "<|nope|>"}, r"eos_token='<\|nope\|>' is not in the vocabulary"),
        ({"eos_token": "<|im_end|>", "pad_token": {"content": "<pad>"}},
         r"pad_token='<pad>' is not in the vocabulary"),
        ({"eos_token": 7}, "eos_token=7 must be a token string"),
    ],
)
def test_bad_tokenizer_config(tmp_path, original, config, match):
    _tokenizer_dir(tmp_path, original, config)
    with pytest.raises(ValueError, match=match):
        load_tokenizer(tmp_path)


def test_chat_template_as_a_list_is_understood(tmp_path, original):
    config = {"eos_token": "<|im_end|>",
              "chat_template": [{"name": "tool_use", "template": "x"},
                                {"name": "default", "template": TEMPLATE}]}
    assert load_tokenizer(_tokenizer_dir(tmp_path, original, config)).default_system == SYSTEM


def _write_gguf_fields(path, tok, **changes):
    """A tokenizer GGUF like `_write_gguf`, with some metadata replaced (None: left out)."""
    data = json.loads(tok.to_str())
    vocab = data["model"]["vocab"]
    tokens = [None] * len(vocab)
    for t, i in vocab.items():
        tokens[i] = t
    fields = {
        "tokens": tokens,
        "merges": [m if isinstance(m, str) else " ".join(m) for m in data["model"]["merges"]],
        "types": [gguf.TokenType.CONTROL if t in SPECIALS else gguf.TokenType.NORMAL
                  for t in tokens],
        "eos": vocab["<|im_end|>"],
    }
    fields.update(changes)
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("smollm")
    if fields["tokens"] is not None:
        writer.add_token_list(fields["tokens"])
    if fields["merges"] is not None:
        writer.add_token_merges(fields["merges"])
    writer.add_token_types(fields["types"])
    writer.add_eos_token_id(fields["eos"])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        ({"tokens": None}, "the GGUF has no tokenizer.ggml.tokens"),
        ({"merges": None}, "the GGUF has no tokenizer.ggml.merges"),
        ({"merges": ["ab"]}, r"tokenizer.ggml.merges\[0\]='ab' is not 'left right'"),
        ({"eos": 10_000}, r"eos_token_id=10000 is not a token id of the \d+-token vocabulary"),
        ({"types": [1, 1]}, r"token_type has 2 entries for \d+ tokens"),
        ({"merges": ["zzz yyy"]}, "the GGUF tokenizer is inconsistent"),
    ],
)
def test_bad_gguf_tokenizer_metadata(tmp_path, original, changes, match):
    path = _write_gguf_fields(tmp_path / "t.gguf", original, **changes)
    with pytest.raises(ValueError, match=match) as e:
        from_gguf(path)
    assert str(path) in str(e.value)


def test_gguf_without_a_tokenizer(tmp_path):
    writer = gguf.GGUFWriter(str(tmp_path / "bare.gguf"), "llama")
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(ValueError, match="bare.gguf: the GGUF has no tokenizer"):
        load_tokenizer(tmp_path / "bare.gguf")
    (tmp_path / "empty.gguf").write_bytes(b"")
    with pytest.raises(ValueError, match=r"empty.gguf: the GGUF file is empty"):
        load_tokenizer(tmp_path / "empty.gguf")
