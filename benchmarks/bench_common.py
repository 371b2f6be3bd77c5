"""Pieces shared by the benchmarks that compare sera_jax with PyTorch / Hugging Face.

- `matmul_peak_flops`: this machine's float32 matmul peak (best of a few large `jnp.dot`s);
- `sampler_flops` / `train_flops`: useful FLOPs of a `generate` call and of one
  forward + backward over a rollout batch (formulas in their docstrings);
- `hf_model`: the Hugging Face model with a sera_jax `Decoder`'s exact weights
  (`save_hf_checkpoint` -> `AutoModelForCausalLM.from_pretrained`);
- `hf_sample`: `generate` with the benchmarks' conventions (plain sampling at T = 1);
- `machine`, `cpu_name`, `load_text`: cores, load average and CPU model, for the record;
- `timed` / `median_timed`: wall and process-CPU seconds of a call;
- `write_report`: print a result and write it to the `--out` path when one is given.

Imported by the benchmark scripts next to it (run as `python benchmarks/<name>.py`, which
puts this directory on `sys.path`). torch and transformers are imported lazily.
"""

from __future__ import annotations

import os
import platform
import statistics
import tempfile
import time
from collections.abc import Sequence
from typing import Any


def matmul_peak_flops(n: int = 2048, repeats: int = 5) -> tuple[float, float]:
    """Best float32 FLOP/s of an [n, n] @ [n, n] jnp.dot (2 n^3 FLOPs): (per wall second,
    per CPU second of this process). The second is robust to other processes' load."""
    import jax
    import jax.numpy as jnp

    a = jax.random.normal(jax.random.key(0), (n, n), jnp.float32)
    b = jax.random.normal(jax.random.key(1), (n, n), jnp.float32)
    dot = jax.jit(jnp.dot)
    dot(a, b).block_until_ready()
    best_wall = best_cpu = float("inf")
    for _ in range(repeats):
        wall, cpu = time.perf_counter(), time.process_time()
        dot(a, b).block_until_ready()
        best_wall = min(best_wall, time.perf_counter() - wall)
        best_cpu = min(best_cpu, time.process_time() - cpu)
    return 2 * n**3 / best_wall, 2 * n**3 / best_cpu


def matmul_params(cfg) -> tuple[int, int]:
    """(matmul parameters of the L blocks: q, k, v, o, gate, up, down; of the vocabulary
    head: D * V) of a `DecoderConfig`."""
    d, f, h, hkv = cfg.hidden_size, cfg.intermediate_size, cfg.num_heads, cfg.num_kv_heads
    dh = cfg.resolved_head_dim
    per_layer = d * h * dh * 2 + d * hkv * dh * 2 + 3 * d * f
    return cfg.num_layers * per_layer, d * cfg.vocab_size


def sampler_flops(cfg, prefill_rows: int, batch: int, prompt_len: int, new_tokens: int) -> float:
    """FLOPs of one generate call: `prefill_rows` prompts prefilled, `batch` rows decoded.

        prefill  R * [2 * N_mm * P + L * 2 * H * Dh * P * (P + 1)]      (causal attention)
        decode   B * sum_{t=1..T-1} [2 * N_mm + L * 4 * H * Dh * (P + t)]

    N_mm = matmul parameters (blocks + vocabulary head), P = prompt length, T = new tokens,
    L layers, H query heads, Dh head size (sera_jax prefills each distinct prompt once, HF's
    `num_return_sequences` every row).
    """
    body, head = matmul_params(cfg)
    n_mm, h, dh, layers = body + head, cfg.num_heads, cfg.resolved_head_dim, cfg.num_layers
    prefill = 2 * n_mm * prompt_len + layers * 2 * h * dh * prompt_len * (prompt_len + 1)
    decode = sum(2 * n_mm + layers * 4 * h * dh * (prompt_len + t) for t in range(1, new_tokens))
    return float(prefill_rows * prefill + batch * decode)


def train_flops(cfg, rows: int, prompt_len: int, completion_len: int) -> float:
    """Useful FLOPs of one forward + backward (3x the forward) over `rows` sequences of
    S = prompt_len + completion_len tokens, the vocabulary head only where a completion
    token is predicted:

        3 * rows * [2 * N_blocks * S + 2 * D * V * T + L * 2 * H * Dh * S * (S + 1)]
    """
    body, head = matmul_params(cfg)
    s, h, dh = prompt_len + completion_len, cfg.num_heads, cfg.resolved_head_dim
    forward = 2 * body * s + 2 * head * completion_len + cfg.num_layers * 2 * h * dh * s * (s + 1)
    return float(3 * rows * forward)


def shared_prefix_train_flops(cfg, prefix_rows: int, rows: int, prompt_len: int,
                              completion_len: int) -> float:
    """`train_flops` of `logprobs.shared_prefix_logprobs` (`rl.share_prompt_prefix`):
    `prefix_rows` prompt forwards of W = prompt_len tokens (the head at the last one), and
    `rows` completion blocks of T - 1 tokens attending to their prompt's W slots and
    causally to each other (T = completion_len):

        3 * prefix_rows * [2 N_blocks W + 2 D V + L * 2 H Dh W (W + 1)]
        + 3 * rows * [2 N_blocks (T-1) + 2 D V (T-1) + L * 2 H Dh (T-1) (2W + T)]
    """
    body, head = matmul_params(cfg)
    w, t, h, dh = prompt_len, completion_len, cfg.num_heads, cfg.resolved_head_dim
    prompt = 2 * body * w + 2 * head + cfg.num_layers * 2 * h * dh * w * (w + 1)
    block = (2 * body * (t - 1) + 2 * head * (t - 1)
             + cfg.num_layers * 2 * h * dh * (t - 1) * (2 * w + t))
    return float(3 * (prefix_rows * prompt + rows * block))


def torch_threads() -> int:
    """Set torch's intra-op threads to this process's CPU affinity (`taskset -c 0` = 1)."""
    import torch

    threads = len(os.sched_getaffinity(0))
    torch.set_num_threads(threads)
    return threads


def hf_model(model) -> Any:
    """The `transformers` causal LM with `model`'s exact float32 weights (written by
    `save_hf_checkpoint`, read by `AutoModelForCausalLM.from_pretrained`), in eval mode."""
    import torch
    import transformers

    from sera_jax.models.weights import save_hf_checkpoint

    with tempfile.TemporaryDirectory(prefix="sera_bench_hf_") as tmp:
        save_hf_checkpoint(model, tmp)
        hf = transformers.AutoModelForCausalLM.from_pretrained(tmp, dtype=torch.float32)
    return hf.eval()


def hf_sample(hf, input_ids, attention_mask, *, new_tokens: int, samples: int = 1,
              pad_id: int = 0, stop_ids: Sequence[int] = ()):
    """`hf.generate`: plain sampling at temperature 1 (`top_k=0`, `top_p=1`), `samples`
    rows per prompt (`num_return_sequences`, rows of a prompt contiguous). With `stop_ids`
    a row stops after any of them (padded with `pad_id`); without, every row gets exactly
    `new_tokens` (`min_new_tokens`). Returns the [rows, W + T'] token tensor."""
    import torch

    stops = [int(s) for s in stop_ids]
    with torch.inference_mode():
        return hf.generate(
            input_ids=input_ids, attention_mask=attention_mask, do_sample=True,
            temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=new_tokens,
            min_new_tokens=None if stops else new_tokens, num_return_sequences=samples,
            pad_token_id=pad_id, eos_token_id=stops or None,
        )


def machine() -> dict[str, Any]:
    """CPU cores of this process's affinity, total cores and the 1/5/15-minute load."""
    return {"cores": len(os.sched_getaffinity(0)), "cpus": os.cpu_count(),
            "load": tuple(round(x, 2) for x in os.getloadavg())}


def cpu_name() -> str:
    """The CPU model (from /proc/cpuinfo where there is one), usable / total cores, Python."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f
                        if line.startswith("model name")), cpu)
    except OSError:
        pass
    return (f"{cpu}, {len(os.sched_getaffinity(0))} usable of {os.cpu_count()} cores, "
            f"Python {platform.python_version()}")


def load_text() -> str:
    """'load average (1/5/15 min) a / b / c'."""
    return "load average (1/5/15 min) " + " / ".join(f"{x:.2f}" for x in os.getloadavg())


def timed(fn) -> tuple[Any, float, float]:
    """(fn(), wall seconds, process CPU seconds)."""
    wall, cpu = time.perf_counter(), time.process_time()
    out = fn()
    return out, time.perf_counter() - wall, time.process_time() - cpu


def median_timed(fn, repeats: int) -> tuple[float, float]:
    """(median wall s, median process CPU s) of `fn()` over `repeats` calls."""
    runs = [timed(fn)[1:] for _ in range(repeats)]
    return (statistics.median(w for w, _ in runs), statistics.median(c for _, c in runs))


def write_report(text: str, path: str = "") -> None:
    """Print `text`; also write it to `path` (a benchmark's `--out`) unless that is ''."""
    print(text, flush=True)
    if path:
        with open(path, "w") as f:
            f.write(text if text.endswith("\n") else text + "\n")
