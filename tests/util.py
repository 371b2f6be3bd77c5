"""Helpers shared by tests: dotted config overrides, multi-process launches, notebooks, and a
tiny random language model with a byte tokenizer (a Hugging Face directory)."""

from __future__ import annotations

import os
import socket
import subprocess
from collections.abc import Mapping, Sequence
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def set_field(config: Any, path: str, value: Any) -> Any:
    """`config.a.b.c = value` for `path="a.b.c"` (as `--config.a.b.c=value` would); returns
    the config."""
    *parents, last = path.split(".")
    target = config
    for key in parents:
        target = target[key]
    target[last] = value
    return config


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(commands: Sequence[Sequence[str]], env: Mapping[str, str], timeout: float
           ) -> list[str]:
    """Run the commands concurrently from the repository root (processes of one JAX job);
    every one must exit 0 (else AssertionError with its output). Returns their outputs."""
    procs = [subprocess.Popen(list(cmd), cwd=ROOT, env=dict(env), stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for cmd in commands]
    outputs = []
    try:
        for p in procs:
            outputs.append(p.communicate(timeout=timeout)[0])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for p, out in zip(procs, outputs):
        assert p.returncode == 0, out[-3000:]
    return outputs


def cpu_job_env(**extra: str) -> dict[str, str]:
    """The environment of one CPU process of a multi-process test job (no forced devices)."""
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    env.update(PYTHONPATH=ROOT + os.pathsep + env.get("PYTHONPATH", ""), JAX_PLATFORMS="cpu",
               **extra)
    return env


#: The special tokens of `write_byte_tokenizer` (ChatML, with `<|endoftext|>` as pad).
BYTE_SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")


def write_byte_tokenizer(path: str) -> int:
    """A byte-level tokenizer (256 byte tokens, no merges, the ChatML specials) in
    `path`/tokenizer.json with its tokenizer_config.json; returns its vocab size."""
    import json

    import tokenizers
    from tokenizers import decoders, models, pre_tokenizers

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {ch: i for i, ch in enumerate(alphabet)}
    tok = tokenizers.Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([tokenizers.AddedToken(s, special=True) for s in BYTE_SPECIALS])
    tok.save(os.path.join(path, "tokenizer.json"))
    with open(os.path.join(path, "tokenizer_config.json"), "w") as f:
        json.dump({"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}, f)
    return tok.get_vocab_size(with_added_tokens=True)


def write_tiny_lm(path: str, seed: int = 0) -> str:
    """A tiny random 2-layer Qwen2-style decoder (hidden 32) with `write_byte_tokenizer`'s
    tokenizer, saved as a Hugging Face checkpoint directory `path` (a `model.source='hf'`
    policy for tests; made if missing); returns `path`."""
    from flax import nnx

    from sera_jax.models.decoder import Decoder, DecoderConfig
    from sera_jax.models.weights import save_hf_checkpoint

    os.makedirs(path, exist_ok=True)
    vocab = write_byte_tokenizer(path)
    cfg = DecoderConfig(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_layers=2,
                        num_heads=2, num_kv_heads=1, qkv_bias=True, name="tiny")
    save_hf_checkpoint(Decoder(cfg, rngs=nnx.Rngs(seed)), path, model_type="qwen2")
    return path


def execute_notebook(name: str, monkeypatch) -> list[dict]:
    """Run `notebooks/<name>` top to bottom in its smoke setting (`SERA_NOTEBOOK_SMOKE=1`)
    from the repository root; returns the code cells' outputs."""
    import nbformat
    from nbclient import NotebookClient

    monkeypatch.setenv("SERA_NOTEBOOK_SMOKE", "1")
    monkeypatch.setenv("PYTHONPATH", ROOT)
    nb = nbformat.read(os.path.join(ROOT, "notebooks", name), as_version=4)
    NotebookClient(nb, timeout=600, kernel_name="python3",
                   resources={"metadata": {"path": ROOT}}).execute()
    return [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]


__all__ = ["BYTE_SPECIALS", "ROOT", "cpu_job_env", "execute_notebook", "free_port", "launch",
           "set_field", "write_byte_tokenizer", "write_tiny_lm"]
