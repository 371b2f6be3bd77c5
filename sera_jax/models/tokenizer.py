"""Tokenizers for the decoder: `tokenizer.json` directories or GGUF metadata, plus ChatML.

A GGUF file stores a gpt2-style byte-level BPE as `tokenizer.ggml.tokens` / `merges` /
`token_type` and names its pre-tokenizer in `tokenizer.ggml.pre`; `from_gguf` rebuilds the
equivalent `tokenizers.Tokenizer` (byte-level BPE with llama.cpp's split regex for that
pre-tokenizer; control tokens become special added tokens).

SmolLM2 and Qwen use ChatML:
`<|im_start|>system\\n...<|im_end|>\\n<|im_start|>user\\n...<|im_end|>\\n<|im_start|>assistant\\n`.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np
import tokenizers
from tokenizers import Regex, decoders, models, pre_tokenizers

from sera_jax.models.weights import open_gguf

# llama.cpp pre-tokenizer names -> the tokenizers pre-tokenizer that splits identically.
_QWEN2_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def _pre_tokenizer(pre: str) -> pre_tokenizers.PreTokenizer:
    gpt2 = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if pre in ("smollm", "starcoder", "refact"):  # single digits, then the GPT-2 split
        return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), gpt2])
    if pre in ("qwen2", "deepseek-r1-qwen"):
        split = pre_tokenizers.Split(Regex(_QWEN2_PATTERN), behavior="isolated")
        byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
        return pre_tokenizers.Sequence([split, byte_level])
    if pre not in ("gpt2", "default"):
        warnings.warn(
            f"GGUF tokenizer.ggml.pre={pre!r} is not known here; using the GPT-2 split",
            stacklevel=3,
        )
    return gpt2


@dataclasses.dataclass(frozen=True)
class Tokenizer:
    """A `tokenizers.Tokenizer` with its special ids and (ChatML) chat formatting.

    `stop_ids`: generation stops after any of these (eos, `<|im_end|>`, `<|endoftext|>`
    when present). `default_system`: the system prompt the model's chat template inserts
    when a conversation has none (None if it inserts nothing).
    """

    tok: tokenizers.Tokenizer
    eos_id: int
    bos_id: int | None
    pad_id: int
    stop_ids: tuple[int, ...]
    default_system: str | None = None

    @property
    def vocab_size(self) -> int:
        return self.tok.get_vocab_size(with_added_tokens=True)

    def token_id(self, token: str) -> int:
        """Id of one vocabulary entry; ValueError if absent."""
        idx = self.tok.token_to_id(token)
        if idx is None:
            raise ValueError(f"token={token!r} is not in the vocabulary")
        return idx

    def encode(self, text: str) -> np.ndarray:
        """Token ids (int32) of `text`; special tokens written in the text are recognised."""
        return np.asarray(self.tok.encode(text, add_special_tokens=False).ids, np.int32)

    def encode_batch(self, texts: Sequence[str]) -> list[np.ndarray]:
        return [np.asarray(e.ids, np.int32)
                for e in self.tok.encode_batch(list(texts), add_special_tokens=False)]

    def decode(self, ids: Sequence[int] | np.ndarray, skip_special_tokens: bool = False) -> str:
        return self.tok.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)

    def chat_prompt(
        self,
        messages: str | Sequence[dict[str, str]],
        system: str | None = None,
        add_generation_prompt: bool = True,
    ) -> str:
        """ChatML text of a conversation (a plain string is one user message).

        The system prompt is `system`, else the conversation's own, else `default_system`.
        """
        if isinstance(messages, str):
            messages = [{"role": "user", "content": messages}]
        messages = list(messages)
        if system is not None:
            messages = [{"role": "system", "content": system}] + [
                m for m in messages if m["role"] != "system"]
        elif (not messages or messages[0]["role"] != "system") and self.default_system:
            messages = [{"role": "system", "content": self.default_system}] + messages
        parts = [f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages]
        if add_generation_prompt:
            parts.append("<|im_start|>assistant\n")
        return "".join(parts)

    def encode_chat(
        self, messages: str | Sequence[dict[str, str]], system: str | None = None
    ) -> np.ndarray:
        """Token ids of `chat_prompt(messages, system)` (ends with the assistant header)."""
        return self.encode(self.chat_prompt(messages, system))


def _default_system(chat_template: Any) -> str | None:
    # Templates that insert a system turn carry it as a literal after "<|im_start|>system\n".
    if isinstance(chat_template, list):  # [{"name": "default", "template": "..."}, ...]
        named = {t.get("name"): t.get("template") for t in chat_template if isinstance(t, dict)}
        chat_template = named.get("default")
    if not isinstance(chat_template, str) or not chat_template:
        return None
    m = re.search(r"<\|im_start\|>system\\?\n(.*?)<\|im_end\|>", chat_template, re.S)
    if not m or "{{" in m.group(1) or "{%" in m.group(1):
        return None
    return m.group(1)


def _stop_ids(tok: tokenizers.Tokenizer, eos_id: int) -> tuple[int, ...]:
    ids = {eos_id}
    for t in ("<|im_end|>", "<|endoftext|>"):
        idx = tok.token_to_id(t)
        if idx is not None:
            ids.add(idx)
    return tuple(sorted(ids))


def from_gguf(source) -> Tokenizer:
    """Rebuild the byte-level BPE tokenizer stored in a GGUF file's metadata.

    `source`: a path or an open `gguf.GGUFReader` (see `weights.open_gguf`).
    """
    import gguf

    reader = open_gguf(source)
    path = os.fspath(reader.data.filename)

    def get(key, default=None):
        field = reader.fields.get(key)
        return default if field is None else field.contents()

    fix = ("use a GGUF with an embedded gpt2-style tokenizer (llama.cpp's converter writes "
           "one) or a tokenizer.json directory")
    kind = get("tokenizer.ggml.model")
    if kind is None:
        raise ValueError(f"{path}: the GGUF has no tokenizer (no tokenizer.ggml.model); {fix}")
    if kind != "gpt2":
        raise ValueError(
            f"{path}: tokenizer.ggml.model={kind!r}; only gpt2-style byte-level BPE is supported"
        )
    tokens = _string_list(get("tokenizer.ggml.tokens"), "tokenizer.ggml.tokens", path, fix)
    merge_texts = _string_list(get("tokenizer.ggml.merges"), "tokenizer.ggml.merges", path,
                               fix)
    bad = next((i for i, m in enumerate(merge_texts) if m.count(" ") != 1), None)
    if bad is not None:
        raise ValueError(f"{path}: tokenizer.ggml.merges[{bad}]={merge_texts[bad]!r} is not "
                         f"'left right'; the file is corrupt. {fix}")
    merges = [tuple(m.split(" ", 1)) for m in merge_texts]
    types = list(get("tokenizer.ggml.token_type", [1] * len(tokens)))
    if len(types) != len(tokens):
        raise ValueError(f"{path}: tokenizer.ggml.token_type has {len(types)} entries for "
                         f"{len(tokens)} tokens; the file is corrupt. {fix}")
    vocab = {t: i for i, t in enumerate(tokens)}
    try:
        tok = tokenizers.Tokenizer(models.BPE(vocab=vocab, merges=merges, ignore_merges=False))
    except Exception as e:  # noqa: BLE001 -- tokenizers raises a bare Exception
        raise ValueError(f"{path}: the GGUF tokenizer is inconsistent ({e}). {fix}") from e
    tok.pre_tokenizer = _pre_tokenizer(get("tokenizer.ggml.pre", "default"))
    tok.decoder = decoders.ByteLevel()
    control = int(gguf.TokenType.CONTROL)
    specials = [tokenizers.AddedToken(t, special=True, normalized=False)
                for t, ty in zip(tokens, types) if ty == control]
    tok.add_special_tokens(specials)
    eos = _token_index(get("tokenizer.ggml.eos_token_id", 0), "eos", len(tokens), path)
    bos = get("tokenizer.ggml.bos_token_id")
    bos = None if bos is None else _token_index(bos, "bos", len(tokens), path)
    pad = _token_index(get("tokenizer.ggml.padding_token_id", eos), "padding", len(tokens), path)
    return Tokenizer(
        tok=tok,
        eos_id=eos,
        bos_id=bos,
        pad_id=pad,
        stop_ids=_stop_ids(tok, eos),
        default_system=_default_system(get("tokenizer.chat_template")),
    )


def _string_list(value: Any, key: str, path: str, fix: str) -> list[str]:
    if value is None:
        raise ValueError(f"{path}: the GGUF has no {key}; {fix}")
    values = list(value) if isinstance(value, list | tuple) else None
    if not values or not all(isinstance(v, str) for v in values):
        raise ValueError(f"{path}: {key} must be a non-empty list of strings; the file is "
                         f"corrupt. {fix}")
    return values


def _token_index(value: Any, what: str, n: int, path: str) -> int:
    """A special-token id from GGUF metadata, checked against the vocabulary size."""
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or not 0 <= value < n:
        raise ValueError(
            f"{path}: tokenizer.ggml.{what}_token_id={value!r} is not a token id of the "
            f"{n}-token vocabulary; the file is corrupt or its tokenizer metadata is wrong"
        )
    return int(value)


def _token_text(value: Any, key: str, file: str) -> str | None:
    if isinstance(value, dict):  # {"content": "<|im_end|>", ...}
        value = value.get("content")
    if value is not None and not isinstance(value, str):
        raise ValueError(f"{file}: {key}={value!r} must be a token string (or an object "
                         "with a 'content' string)")
    return value


def from_pretrained_dir(path: str | os.PathLike) -> Tokenizer:
    """Load `tokenizer.json` (+ `tokenizer_config.json` for eos/bos/pad and chat template)."""
    path = os.fspath(path)
    tok_file = os.path.join(path, "tokenizer.json")
    if not os.path.isfile(tok_file):
        raise FileNotFoundError(f"no tokenizer.json in {path!r}")
    try:
        tok = tokenizers.Tokenizer.from_file(tok_file)
    except Exception as e:  # noqa: BLE001 -- tokenizers raises a bare Exception
        raise ValueError(
            f"{tok_file}: not a readable tokenizer.json ({e}); it is truncated, corrupt or "
            "from an incompatible `tokenizers` version. Fix: re-download it") from e
    tcfg: dict[str, Any] = {}
    cfg_file = os.path.join(path, "tokenizer_config.json")
    if os.path.isfile(cfg_file):
        tcfg = _read_json_object(cfg_file)

    def lookup(key):
        text = _token_text(tcfg.get(key), key, cfg_file)
        if text is None:
            return None
        idx = tok.token_to_id(text)
        if idx is None:
            raise ValueError(
                f"{cfg_file}: {key}={text!r} is not in the vocabulary of {tok_file}; the two "
                "files do not belong together. Fix: use the tokenizer_config.json shipped with "
                "this tokenizer.json")
        return idx

    eos = lookup("eos_token")
    if eos is None:
        for t in ("<|im_end|>", "<|endoftext|>", "</s>"):
            eos = tok.token_to_id(t)
            if eos is not None:
                break
    if eos is None:
        raise ValueError(f"{path}: cannot determine the eos token (set eos_token in "
                         "tokenizer_config.json)")
    pad = lookup("pad_token")
    return Tokenizer(
        tok=tok,
        eos_id=eos,
        bos_id=lookup("bos_token"),
        pad_id=eos if pad is None else pad,
        stop_ids=_stop_ids(tok, eos),
        default_system=_default_system(tcfg.get("chat_template")),
    )


def _read_json_object(file: str) -> dict[str, Any]:
    fix = "re-download it (or delete it: eos falls back to <|im_end|> / <|endoftext|>)"
    try:
        with open(file, "rb") as f:
            value = json.loads(f.read().decode("utf-8"))
    except UnicodeDecodeError as e:
        raise ValueError(f"{file}: not UTF-8 text (byte {e.start}); {fix}") from e
    except json.JSONDecodeError as e:
        raise ValueError(f"{file}: not valid JSON (line {e.lineno}, column {e.colno}: "
                         f"{e.msg}); {fix}") from e
    if not isinstance(value, dict):
        raise ValueError(f"{file}: must hold a JSON object, got {type(value).__name__}; {fix}")
    return value


def load_tokenizer(path: str | os.PathLike) -> Tokenizer:
    """From a `.gguf` file or a directory holding `tokenizer.json`."""
    path = os.fspath(path)
    if path.endswith(".gguf"):
        return from_gguf(path)
    if os.path.isdir(path):
        return from_pretrained_dir(path)
    raise FileNotFoundError(
        f"tokenizer path {path!r} is neither a .gguf file nor a directory with tokenizer.json"
    )
