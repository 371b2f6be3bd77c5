r"""Accelerator check: sampler tokens/s, train-step MFU and a few maze RL steps in one table.

    python benchmarks/accelerator_check.py             # one GPU / TPU host, <= 8 minutes
    python benchmarks/accelerator_check.py --smoke     # tiny shapes, < 60 s on CPU (tested)
    bash benchmarks/accelerator_check.sh [flags]       # the same with the repo's .venv

Parts. Each runs in its own Python process with a hard wall-clock budget (`--budgets`, total
`--total_budget_s`): a part that is slow, hangs or runs out of memory costs its own budget
and is reported on its own line (FAILED / TIMEOUT / SKIPPED), never silently dropped, and
every process starts with an empty accelerator. The parent never initialises a backend.

  device            device kind and count, jax version, measured bf16 matmul peak
  sampler_smollm2   `sera_jax.sampling.generate` tokens/s, SmolLM2-360M-shaped random weights
  train_smollm2     the RL trainer's jitted train step (token log-probs, loss, gradient
                    accumulated over 2 micro-batches, finite-guarded AdamW) and its MFU
  sampler_qwen25 /  the same for Qwen2.5-1.5B-shaped weights (preset qwen2.5_math_1.5b)
  train_qwen25
  attention         causal attention fwd+bwd at 4 x 4,096 tokens: `DecoderConfig.attention_impl`
                    "dot_product" (jax.nn.dot_product_attention, cuDNN on a GPU) vs "plain"
                    (benchmarks/attention_bench.py)
  maze              `sera_jax.studies.paired.smoke` (the code path of experiments/maze_smoke.py)
                    on configs/maze/maze17_paper.py: a few RL steps from a fresh policy

Shapes come from the paper configs of the math setting (SERA_SPEC §7 "Math": N0 = 16
rollouts per prompt, SmolLM2 responses <= 2048 tokens; what the spec leaves open, i.e. 128
prompts per step, prompt caps 512 / 1024 tokens, Qwen responses <= 3072 tokens, 512 rows per
sampler call and 128 / 64 rows per gradient micro-batch, is the choice of
configs/math/smollm2_360m_gsm8k.py and qwen25_math_1p5b.py), with their dtypes (bfloat16
compute, float32 parameters) on a mesh of all local devices (`sera_jax.sharding.make_mesh`,
fsdp = gcd(config fsdp, local devices), the rest on `data`). Random prompts of full width, no
stop token: every row generates all its tokens and every completion token is trained on.
What one chip cannot hold at those shapes is scaled down and said in the row's notes:

* sampler: rows per call are capped so the KV cache fits device memory; the number of new
  tokens T is the config's maximum when a short probe run (T = 97) predicts it fits the
  part's budget, else the largest halving of it that does;
* train step: rows per micro-batch are capped by an activation-memory estimate (and halved
  on an out-of-memory error); sequences are prompt + the full response length.

FLOPs are *useful* FLOPs (`benchmarks/bench_common.py`): per train step
`rows * [6 N_blocks S + 6 D V T + 6 L H Dh S (S + 1)]` (forward + backward = 3x forward;
N_blocks the q/k/v/o/gate/up/down matmul parameters, the vocabulary head D x V counted at the
T completion positions whose log-probabilities the loss uses, causal attention over
S = prompt + T tokens); per sampler call `sampler_flops` (prefill + decode). MFU = FLOPs /
time / (bf16 peak per chip x chips), the peak from `PEAK_BF16_FLOPS` keyed by
`jax.devices()[0].device_kind`; a second column uses the measured bf16 matmul peak instead.
"""

from __future__ import annotations

import dataclasses
import gc
import json
import math
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np
from absl import app, flags
from attention_bench import part_attention
from bench_common import sampler_flops, train_flops

from sera_jax.tasks.base import RLTask  # NumPy only: the parent never imports jax

ROOT = Path(__file__).resolve().parents[1]
_T0 = time.time()

#: Dense bf16 peak FLOP/s per chip: (lower-case substring of `device_kind`, FLOP/s, source);
#: the first match wins. NVIDIA datasheets print bf16 Tensor Core figures "with sparsity",
#: twice the dense ones; Google's Cloud TPU system-architecture pages give dense bf16 peaks.
PEAK_BF16_FLOPS: tuple[tuple[str, float, str], ...] = (
    ("h100 pcie", 756e12, "NVIDIA H100 PCIe datasheet: 1,513 TFLOP/s with sparsity"),
    ("h100 nvl", 835e12, "NVIDIA H100 NVL datasheet: 1,671 TFLOP/s with sparsity"),
    ("h200 nvl", 835e12, "NVIDIA H200 NVL datasheet: 1,671 TFLOP/s with sparsity"),
    ("h100", 989e12, "NVIDIA H100 SXM datasheet: 1,979 TFLOP/s with sparsity"),
    ("h200", 989e12, "NVIDIA H200 SXM datasheet: 1,979 TFLOP/s with sparsity"),
    ("a100", 312e12, "NVIDIA A100 datasheet: 624 TFLOP/s with sparsity"),
    ("tpu v4", 275e12, "cloud.google.com/tpu/docs/v4: 275 TFLOP/s bf16 per chip"),
    ("tpu v5 lite", 197e12, "cloud.google.com/tpu/docs/v5e: 197 TFLOP/s bf16 per chip"),
    ("tpu v5e", 197e12, "cloud.google.com/tpu/docs/v5e: 197 TFLOP/s bf16 per chip"),
    ("tpu v5", 459e12, "cloud.google.com/tpu/docs/v5p: 459 TFLOP/s bf16 per chip"),
    ("tpu v6", 918e12, "cloud.google.com/tpu/docs/v6e: 918 TFLOP/s bf16 per chip"),
)

#: Model parts: decoder preset, the paper config its shapes and dtypes come from, label.
MODELS: dict[str, tuple[str, str, str]] = {
    "smollm2": ("smollm2_360m", "configs/math/smollm2_360m_gsm8k.py", "SmolLM2-360M"),
    "qwen25": ("qwen2.5_math_1.5b", "configs/math/qwen25_math_1p5b.py", "Qwen2.5-1.5B"),
}
PARTS = ("device", "sampler_smollm2", "train_smollm2", "attention", "sampler_qwen25",
         "train_qwen25", "maze")
#: Seconds per part (process start, compiles and runs included); the sum stays under 8 min.
BUDGETS = {"device": 30, "sampler_smollm2": 80, "train_smollm2": 70, "attention": 40,
           "sampler_qwen25": 90, "train_qwen25": 80, "maze": 110}
#: With --smoke: generous limits that only guard against a hang (the smoke takes seconds).
SMOKE_BUDGET_S = 120
#: New tokens of the sampler's probe run (two decode phases of 48 steps).
PROBE_TOKENS = 97
#: Fraction of the memory the runtime reports (`bytes_limit`) that the size estimates fill.
MEMORY_FRACTION = 0.8

_SMOKE = flags.DEFINE_bool("smoke", False, "Tiny shapes (2-layer models, 8-16 tokens, the "
                           "tiny maze config): checks the code path in < 60 s on CPU.")
_PARTS = flags.DEFINE_list("parts", list(PARTS), f"Parts to run, a subset of {PARTS}.")
_BUDGETS = flags.DEFINE_list("budgets", [], "Per-part budget overrides, 'part=seconds'.")
_TOTAL = flags.DEFINE_float("total_budget_s", 470.0, "Wall-clock limit of the whole check "
                            "(a part that would start past it is skipped).")
_SAMPLER_ROWS = flags.DEFINE_integer("sampler_rows", 0, "Rows per sampler call; 0 = the "
                                     "config's sampling.batch_size, capped to fit memory.")
_TRAIN_ROWS = flags.DEFINE_integer("train_rows", 0, "Rows per gradient micro-batch; 0 = "
                                   "the config's micro_batch_size, capped to fit memory.")
_NEW_TOKENS = flags.DEFINE_integer("new_tokens", 0, "Sampler tokens per row; 0 = the "
                                   "config's maximum, shortened to fit the part's budget.")
_MAZE_CONFIG = flags.DEFINE_string("maze_config", "", "Maze config file ('' = "
                                   "configs/maze/maze17_paper.py, tiny.py with --smoke).")
_MAZE_STEPS = flags.DEFINE_integer("maze_steps", 3, "Maze RL steps (the first compiles).")
_MAZE_DTYPE = flags.DEFINE_string("maze_dtype", "bfloat16", "Compute dtype of the maze "
                                  "policy ('' = the config's own).")
_METHOD = flags.DEFINE_string("method", "sera", "Maze method (sera_jax.methods).")
# "dot_product" by default: on an H200 the plain kernels' query-block loop made the
# SmolLM2-360M train step at 2,560 tokens compile for > 66 s (results/device/2026-12-04_h200).
_ATTENTION = flags.DEFINE_enum("attention", "dot_product", ["dot_product", "plain"],
                               "DecoderConfig.attention_impl of the model parts.")
_OUT = flags.DEFINE_string("out", "", "Optional path: write the markdown table there.")
_JSON_OUT = flags.DEFINE_string("json_out", "", "Optional path: write all results as JSON.")
# Internal: the parent runs each part as `--part=NAME --result=FILE --deadline=EPOCH_S`.
_PART = flags.DEFINE_string("part", "", "(internal) run this one part and write --result.")
_RESULT = flags.DEFINE_string("result", "", "(internal) JSON result file of --part.")
_DEADLINE = flags.DEFINE_float("deadline", 0.0, "(internal) epoch seconds the part must end by.")
_MATMUL_PEAK = flags.DEFINE_float("matmul_peak", 0.0, "(internal) measured FLOP/s per chip.")


# ----------------------------------------------------------------------------- helpers


def peak_bf16(device_kind: str) -> tuple[float, str] | None:
    """(dense bf16 peak FLOP/s per chip, source) of a `device_kind`, or None if unknown."""
    kind = device_kind.lower()
    for key, flops, source in PEAK_BF16_FLOPS:
        if key in kind:
            return flops, source
    return None


def is_oom(error: BaseException) -> bool:
    """Whether an exception is XLA running out of device memory."""
    text = str(error)
    return "RESOURCE_EXHAUSTED" in text or "out of memory" in text.lower()


@dataclasses.dataclass(frozen=True)
class Shapes:
    """Batch shapes of a model part (from the paper config, or tiny with --smoke)."""

    sample_rows: int  # rows per sampler call (rl.sampling.batch_size)
    n0: int  # rollouts per prompt
    prompts: int  # prompts per step
    width: int  # prompt tokens (task.max_prompt_len)
    new_tokens: int  # response tokens (task.max_new_tokens)
    micro_rows: int  # rows per gradient micro-batch (rl.micro_batch_size)
    fsdp: int  # rl.mesh.fsdp of the config


def model_setup(key: str, smoke: bool):
    """(DecoderConfig with the config's dtypes, the paper config, Shapes, label) of a model
    part."""
    import jax.numpy as jnp

    from sera_jax import config_files
    from sera_jax.models.configs import get_config

    preset, path, label = MODELS[key]
    cfg = config_files.get_config(ROOT / path)
    dcfg = get_config(preset, dtype=jnp.dtype(cfg.model.dtype),
                      param_dtype=jnp.dtype(cfg.model.param_dtype),
                      attention_impl=_ATTENTION.value)
    shapes = Shapes(int(cfg.rl.sampling.batch_size), int(cfg.rl.rollouts_per_prompt),
                    int(cfg.rl.prompts_per_step), int(cfg.task.max_prompt_len),
                    int(cfg.task.max_new_tokens), int(cfg.rl.micro_batch_size),
                    int(cfg.rl.mesh.fsdp))
    if smoke:
        dcfg = dcfg.replace(name=dcfg.name + "_tiny", vocab_size=512, hidden_size=64,
                            intermediate_size=128, num_layers=2, num_heads=4, num_kv_heads=2)
        # SmolLM2's 16 new tokens take the sampler's probe path (T >= 2 x 5), Qwen's 8 the
        # direct one: the smoke covers both.
        shapes = dataclasses.replace(shapes, sample_rows=8, n0=4, prompts=2, width=8,
                                     new_tokens=16 if key == "smollm2" else 8, micro_rows=8)
    return dcfg, cfg, shapes, f"{label} ({dcfg.name})"


def local_mesh(fsdp: int):
    """A mesh over all local devices: fsdp = gcd(config fsdp, devices), the rest on data."""
    import jax

    from sera_jax import sharding as shd

    devices = jax.local_devices()
    return shd.make_mesh({"data": -1, "fsdp": math.gcd(max(fsdp, 1), len(devices)),
                          "tensor": 1}, devices=devices)


def mesh_label(mesh) -> str:
    return "x".join(f"{a}{n}" for a, n in mesh.shape.items() if n > 1) or "1 device"


def memory_per_device() -> float | None:
    """Bytes the runtime lets one local device use (None where it does not say, e.g. CPU)."""
    import jax

    stats = jax.local_devices()[0].memory_stats() or {}
    return float(stats["bytes_limit"]) if stats.get("bytes_limit") else None


def dtype_label(dcfg) -> str:
    import jax.numpy as jnp

    return f"{jnp.dtype(dcfg.dtype).name} / params {jnp.dtype(dcfg.param_dtype).name}"


def fit_rows(want: int, per_row: float, fixed: float, divisor: int) -> tuple[int, str | None]:
    """The largest multiple of `divisor` <= `want` (at least `divisor`) whose estimated bytes
    per device, `fixed + rows / divisor * per_row`, fit MEMORY_FRACTION of the device; and
    a note when that is fewer rows than wanted."""
    want = max(divisor, want // divisor * divisor)
    limit = memory_per_device()
    if limit is None:
        return want, None
    per_device = int((MEMORY_FRACTION * limit - fixed) // per_row)
    rows = max(divisor, min(want, per_device * divisor))
    note = None if rows == want else (
        f"rows {want} -> {rows} to fit {limit / 2**30:.0f} GiB per device (estimate)")
    return rows, note


def time_calls(call, deadline: float, max_runs: int, on_each=None) -> list[float]:
    """Wall seconds of 1 to `max_runs` calls of `call()` (which blocks until done); stops
    before a call that would likely end past `deadline` (epoch seconds). `on_each(times)`
    runs after every call (e.g. to save a partial result)."""
    times: list[float] = []
    while len(times) < max_runs:
        if times and time.time() + 1.5 * max(times) > deadline:
            break
        t0 = time.perf_counter()
        call()
        times.append(time.perf_counter() - t0)
        if on_each is not None:
            on_each(times)
    return times


def log(message: str) -> None:
    """A progress line of a part (the parent shows the last ones when a part fails)."""
    print(f"[{_PART.value} +{time.time() - _T0:.0f}s] {message}", flush=True)


def emit(result: dict[str, Any]) -> None:
    """Write a part's result to --result (atomically): a partial one survives a timeout."""
    if not _RESULT.value:
        return
    tmp = _RESULT.value + ".tmp"
    with open(tmp, "w") as f:
        json.dump(result, f)
    os.replace(tmp, _RESULT.value)


# ----------------------------------------------------------------------------- parts


def part_device(smoke: bool, deadline: float) -> dict[str, Any]:
    """Device kind / count / memory, jax version, measured bf16 matmul peak per chip."""
    del deadline
    import jax
    import jax.numpy as jnp

    devices = jax.local_devices()
    accel = devices[0].platform != "cpu"
    n = 256 if smoke else (8192 if accel else 2048)
    calls = 10 if accel else 1  # back-to-back calls amortise the launch latency
    a = jax.random.normal(jax.random.key(0), (n, n), jnp.bfloat16)
    b = jax.random.normal(jax.random.key(1), (n, n), jnp.bfloat16)
    dot = jax.jit(jnp.dot)
    dot(a, b).block_until_ready()
    best = math.inf
    for _ in range(5):
        t0 = time.perf_counter()
        jax.block_until_ready([dot(a, b) for _ in range(calls)])
        best = min(best, (time.perf_counter() - t0) / calls)
    limit = memory_per_device()
    return {
        "model": f"bf16 matmul {n}^3", "shape": f"[{n},{n}] @ [{n},{n}], 1 chip",
        "dtype": "bfloat16", "mesh": "1 device", "time_s": best, "compile_s": None,
        "tokens_per_s": None, "flops": 2.0 * n**3, "chips": 1,
        "device_kind": devices[0].device_kind, "platform": devices[0].platform,
        "num_devices": len(devices), "jax": jax.__version__,
        "jaxlib": metadata.version("jaxlib"), "bytes_limit": limit,
        "notes": [] if limit else ["device memory limit not reported"],
    }


def part_sampler(key: str, smoke: bool, deadline: float) -> dict[str, Any]:
    """Sampler tokens/s of `generate` at the paper config's rows per call and lengths."""
    import jax
    from flax import nnx

    from sera_jax import sharding as shd
    from sera_jax.models.decoder import Decoder
    from sera_jax.sampling import SamplingConfig, default_row_keys, generate

    dcfg, _, s, label = model_setup(key, smoke)
    mesh = local_mesh(s.fsdp)
    divisor = shd.batch_divisor(mesh)
    model = shd.shard_model(Decoder(dcfg, rngs=nnx.Rngs(0)), mesh)
    graphdef, state = nnx.split(model)
    notes: list[str] = []
    full_t, width = _NEW_TOKENS.value or s.new_tokens, s.width
    kv_row = (2 * dcfg.num_layers * dcfg.num_kv_heads * dcfg.resolved_head_dim
              * np.dtype(dcfg.dtype).itemsize)
    param_bytes = sum(x.nbytes for x in jax.tree.leaves(state)) / mesh.shape["fsdp"]
    # Per row: the final KV cache, 1.75x while the last phase copy coexists with the previous.
    rows, note = fit_rows(_SAMPLER_ROWS.value or s.sample_rows,
                          1.75 * kv_row * (width + full_t), param_bytes, divisor)
    notes += [note] if note else []

    def compile_for(rows: int, new_tokens: int):
        """(a call running one compiled `generate` and blocking, its compile seconds)."""
        sconfig = SamplingConfig(max_new_tokens=new_tokens, temperature=1.0)  # no stop
        rng = np.random.default_rng(0)
        tokens = rng.integers(0, dcfg.vocab_size, (rows, width), dtype=np.int32)
        keys = np.asarray(jax.random.key_data(default_row_keys(jax.random.key(0), rows)))
        args = shd.shard_batch((tokens, np.ones((rows, width), bool), keys), mesh)

        def sample(state, tokens, mask, keys):
            return generate(nnx.merge(graphdef, state), tokens, mask, None, sconfig,
                            row_keys=keys)

        log(f"compiling generate: {rows} rows, prompt {width} + {new_tokens} new tokens")
        t0 = time.perf_counter()
        with jax.set_mesh(mesh):
            compiled = jax.jit(sample).lower(state, *args).compile()
        compile_s = time.perf_counter() - t0
        log(f"compiled in {compile_s:.1f} s")
        return (lambda: jax.block_until_ready(compiled(state, *args))), compile_s

    def result(rows: int, new_tokens: int, compile_s: float, times: list[float],
               extra: list[str]) -> dict[str, Any]:
        run_s = statistics.median(times)
        p = rows // s.n0 if rows % s.n0 == 0 else None
        return {
            "model": label, "dtype": dtype_label(dcfg), "mesh": mesh_label(mesh),
            "shape": (f"{rows} rows" + (f" ({p}x{s.n0})" if p else "") +
                      f", prompt {width} + {new_tokens} new"),
            "time_s": run_s, "compile_s": compile_s, "tokens_per_s": rows * new_tokens / run_s,
            "flops": sampler_flops(dcfg, rows, rows, width, new_tokens), "chips": mesh.size,
            "notes": notes + extra + [
                f"{len(times)} timed call(s), median; a paper step samples "
                f"{s.prompts}x{s.n0} = {s.prompts * s.n0} rows, {s.sample_rows} per call"],
        }

    # A short probe (compile + one call) predicts how long the full length takes (short
    # lengths skip it); an out-of-memory error halves the rows while time allows.
    probe_t = 5 if smoke else min(PROBE_TOKENS, full_t)
    while True:
        probe, new_tokens, run = None, full_t, None
        try:
            if full_t >= 2 * probe_t:
                run, compile_s = compile_for(rows, probe_t)
                probe = (rows, probe_t, compile_s, time_calls(run, deadline, 1))
                run = None
                log(f"probe call {probe[3][0]:.2f} s")
                emit(result(*probe, [f"partial: the T={probe_t} probe only"]))
                new_tokens = plan_new_tokens(dcfg, rows, width, full_t, probe_t, compile_s,
                                             probe[3][0], deadline - time.time())
                log(f"planned T={new_tokens}")
            if new_tokens is None:
                return result(*probe, [f"T={probe_t} (the probe) of the config's {full_t} "
                                       "new tokens: longer runs were predicted not to fit "
                                       "this part's budget"])
            run, compile_s = compile_for(rows, new_tokens)
            times = time_calls(run, deadline, 3)
            short = [] if new_tokens == full_t else [
                f"T={new_tokens} of the config's {full_t} new tokens: the full length was "
                "predicted not to fit this part's budget (--new_tokens forces a length)"]
            return result(rows, new_tokens, compile_s, times, short)
        except Exception as e:  # noqa: BLE001 - OOM: fewer rows; else the probe or fail
            run = None
            gc.collect()
            if is_oom(e) and rows > divisor and time.time() < deadline - 20:
                notes.append(f"out of memory at {rows} rows: halved")
                rows = max(divisor, rows // 2 // divisor * divisor)
                continue
            if probe is None:
                raise
            return result(*probe, [f"the T={new_tokens} run failed ({type(e).__name__}: "
                                   f"{str(e)[:80]}): the T={probe_t} probe is reported"])


def plan_new_tokens(dcfg, rows: int, width: int, full_t: int, probe_t: int,
                    probe_compile_s: float, probe_run_s: float, remaining_s: float) -> int | None:
    """The longest of full_t, full_t / 2, ... (> probe_t) whose compile + one run is predicted
    to fit `remaining_s`; None if none does.

    Prediction (conservative): the prefill is charged at 70% of the measured matmul peak (so
    the probe's decode share is not underestimated; at most half the probe is prefill), a
    decode step's time grows linearly with the cache slots it reads (memory-bound), and the
    compile of up to 4 decode phases takes twice the 2-phase probe's.
    """
    peak = _MATMUL_PEAK.value
    prefill = (sampler_flops(dcfg, rows, rows, width, 1) / (0.7 * peak)) if peak else 0.0
    prefill = min(prefill, 0.5 * probe_run_s)
    step = (probe_run_s - prefill) / (probe_t - 1)
    t = full_t
    while t > probe_t:
        run = prefill + step * (t - 1) * (width + t / 2) / (width + probe_t / 2)
        if 2 * probe_compile_s + 1.2 * run + 5 <= remaining_s:
            return t
        t //= 2
    return None


def part_train(key: str, smoke: bool, deadline: float) -> dict[str, Any]:
    """MFU of the RL trainer's jitted train step on a random rollout batch of paper length."""
    import jax
    from flax import nnx

    from sera_jax import sharding as shd
    from sera_jax.models.decoder import Decoder
    from sera_jax.rl import trainer as trainer_lib

    dcfg, cfg, s, label = model_setup(key, smoke)
    mesh = local_mesh(s.fsdp)
    divisor = shd.batch_divisor(mesh)
    model = Decoder(dcfg, rngs=nnx.Rngs(0))
    notes: list[str] = []
    width, new_tokens = s.width, s.new_tokens
    n_params = sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.Param)))
    # Fixed bytes per device: float32 parameters, two AdamW moments, gradients, an update.
    rows, note = fit_rows(_TRAIN_ROWS.value or s.micro_rows,
                          train_row_bytes(dcfg, width + new_tokens),
                          5 * 4 * n_params / mesh.shape["fsdp"], divisor)
    notes += [note] if note else []

    def result(times: list[float], compile_s: float, finite: list[float],
               extra: list[str]) -> dict[str, Any]:
        step_s, total = statistics.median(times), 2 * rows
        return {
            "model": label, "dtype": dtype_label(dcfg), "mesh": mesh_label(mesh),
            "shape": f"2 micro-batches x {rows} rows x ({width} + {new_tokens}) tokens",
            "time_s": step_s, "compile_s": compile_s,
            "tokens_per_s": total * (width + new_tokens) / step_s,
            "flops": train_flops(dcfg, total, width, new_tokens), "chips": mesh.size,
            "notes": notes + extra + (
                [] if min(finite) == 1 else ["a step was not finite (its update skipped)"]) + [
                f"{len(times)} timed step(s), median; {n_params / 1e6:.4g}M params, AdamW; "
                f"a paper step has {s.prompts * s.n0 // max(s.micro_rows, 1)} micro-batch(es) "
                f"of {s.micro_rows} rows"],
        }

    while True:
        trainer = state = compiled = carry = batch = None
        try:
            trainer = trainer_lib.Trainer(
                train_config(cfg.rl, rows, mesh), ShapeTask(rows, width, new_tokens), model,
                mesh)
            step = getattr(trainer, "_train_step", None)
            if step is None:
                raise RuntimeError("sera_jax.rl.trainer.Trainer has no _train_step program "
                                   "(the jitted loss + grad + AdamW step this part times)")
            batch = random_batch(rows, width, new_tokens, dcfg.vocab_size, mesh)
            state = trainer.init_state(model)
            log(f"compiling the train step: 2 x {rows} rows x {width + new_tokens} tokens")
            t0 = time.perf_counter()
            with jax.set_mesh(mesh):
                compiled = step.lower(state.params, state.opt_state, batch).compile()
            compile_s = time.perf_counter() - t0
            log(f"compiled in {compile_s:.1f} s")
            carry = {"params": state.params, "opt": state.opt_state, "finite": []}
            state = None

            def run(carry=carry, compiled=compiled, batch=batch):
                carry["params"], carry["opt"], metrics = compiled(carry["params"],
                                                                  carry["opt"], batch)
                carry["finite"].append(float(jax.block_until_ready(metrics["finite"])))

            def partial(times, carry=carry, compile_s=compile_s):
                emit(result(times, compile_s, carry["finite"], ["partial"]))

            times = time_calls(run, deadline, 5, on_each=partial)
            return result(times, compile_s, carry["finite"], [])
        except Exception as e:  # noqa: BLE001 - an OOM shrinks the batch, anything else fails
            trainer = state = compiled = carry = batch = None
            gc.collect()
            if not is_oom(e) or time.time() > deadline - 20:
                raise
            if rows > divisor:
                notes.append(f"out of memory at {rows} rows per micro-batch: halved")
                rows = max(divisor, rows // 2 // divisor * divisor)
            elif new_tokens > 1:
                notes.append(f"out of memory at {rows} rows x {width + new_tokens} tokens: "
                             "response length halved")
                new_tokens //= 2
            else:
                raise


def train_row_bytes(dcfg, seq: int) -> float:
    """Rough activation bytes one training row keeps for the backward pass: float32 logits
    (x3: logits, log-softmax, gradient), per layer ~10 D + 4 F values per token in the compute
    dtype, and float32 causal attention scores and weights (H x S x S/2, x2). An estimate for
    the first try only (an out-of-memory error halves the rows)."""
    act = np.dtype(dcfg.dtype).itemsize
    logits = 3 * 4 * seq * dcfg.vocab_size
    layer = seq * (10 * dcfg.hidden_size + 4 * dcfg.intermediate_size) * act
    attention = 2 * 4 * dcfg.num_heads * seq * (seq / 2 + 64)
    return float(logits + dcfg.num_layers * (layer + attention))


def train_config(rl, rows: int, mesh):
    """The paper config's trainer settings (optimizer, aggregation) for a 2-micro-batch step
    of `rows` rows each on `mesh` (2 rollouts per prompt: the budget is 2 * rows)."""
    from sera_jax.rl import config as rl_config

    c = rl_config.for_method(rl, "sera")
    c.prompts_per_step = rows
    c.rollouts_per_prompt = 2
    c.allocation.n_min = 2
    c.allocation.n_max = max(2, int(c.allocation.n_max))
    c.micro_batch_size = rows
    c.sampling.batch_size = rows
    c.share_prompt_prefix = False  # `random_batch` builds a per-row RolloutBatch
    for axis, size in mesh.shape.items():
        c.mesh[axis] = int(size)
    return c


def random_batch(rows_per_micro: int, width: int, new_tokens: int, vocab: int, mesh):
    """A `RolloutBatch` of 2 x rows random full-length rows on the batch sharding."""
    from sera_jax import sharding as shd
    from sera_jax.rl.state import RolloutBatch

    b = 2 * rows_per_micro
    rng = np.random.default_rng(0)
    return RolloutBatch(*shd.shard_batch((
        rng.integers(0, vocab, (b, width), dtype=np.int32), np.ones((b, width), bool),
        rng.integers(0, vocab, (b, new_tokens), dtype=np.int32),
        np.ones((b, new_tokens), bool), rng.standard_normal(b).astype(np.float32),
        np.ones(b, np.float32)), mesh))


class ShapeTask(RLTask):
    """Constant prompts of a fixed width and an all-zero verifier: a trainer needs a task,
    the timed train step only its shapes."""

    def __init__(self, num_prompts: int, width: int, new_tokens: int):
        self.pad_id, self.stop_ids = 0, ()
        self.max_prompt_len, self.max_new_tokens = width, new_tokens
        self._n = num_prompts

    def split_size(self, split: str) -> int:
        return self._n

    def prompt_tokens(self, split: str, ids) -> list[np.ndarray]:
        return [np.ones(self.max_prompt_len, np.int32) for _ in ids]

    def score(self, split: str, ids, completions, truncated) -> np.ndarray:
        return np.zeros(len(completions), np.float32)


def part_maze(smoke: bool, deadline: float) -> dict[str, Any]:
    """A few RL steps of the maze paper config: `sera_jax.studies.paired.smoke`, the code path
    of experiments/maze_smoke.py."""
    del deadline
    from sera_jax import config_files
    from sera_jax.models.configs import get_config
    from sera_jax.studies import paired

    path = _MAZE_CONFIG.value or str(ROOT / "configs" / "maze" /
                                     ("tiny.py" if smoke else "maze17_paper.py"))
    cfg = config_files.get_config(path)
    if _MAZE_DTYPE.value:
        cfg.model.overrides.dtype = _MAZE_DTYPE.value
    dcfg = get_config(cfg.model.preset, **dict(cfg.model.overrides))
    steps = 1 if smoke else _MAZE_STEPS.value
    r = paired.smoke(cfg, steps, _METHOD.value)
    rl, t = cfg.rl, cfg.task
    return {
        "model": f"{cfg.model.preset} ({Path(path).stem})",
        "shape": (f"{rl.prompts_per_step}x{rl.rollouts_per_prompt} rollouts, prompt "
                  f"{t.size}x{t.size} maze + <= {t.max_new_tokens} new"),
        "dtype": dtype_label(dcfg), "mesh": f"data{int(r['devices'])}",
        "time_s": r["step_s"], "compile_s": r["first_step_s"],
        "tokens_per_s": r["sample_tokens_per_s"], "flops": None, "chips": int(r["devices"]),
        "notes": [f"{steps} RL step(s) of {_METHOD.value}: time = " +
                  ("mean step after the first" if steps > 1 else "the one step") +
                  ", compile column = first step (compile included), tokens/s = sampling; "
                  f"{r['generated_tokens_per_step']:.0f} generated tokens per step, "
                  f"{r['train_tokens_per_s']:.0f} per step-second"],
    }


def run_part(name: str, smoke: bool, deadline: float) -> dict[str, Any]:
    """One part in this process (the child side)."""
    if name == "device":
        return part_device(smoke, deadline)
    if name == "maze":
        return part_maze(smoke, deadline)
    if name == "attention":
        return part_attention(smoke, deadline)
    kind, key = name.split("_", 1)
    return (part_sampler if kind == "sampler" else part_train)(key, smoke, deadline)


# ----------------------------------------------------------------------------- parent


def budgets(smoke: bool) -> dict[str, float]:
    """Per-part budgets: the defaults (or SMOKE_BUDGET_S each) with --budgets overrides."""
    out = {p: float(SMOKE_BUDGET_S if smoke else BUDGETS[p]) for p in PARTS}
    for item in _BUDGETS.value:
        part, _, seconds = item.partition("=")
        if part not in out or not seconds:
            raise app.UsageError(f"--budgets entry {item!r}: want part=seconds, part in {PARTS}")
        out[part] = float(seconds)
    return out


def launch(name: str, budget_s: float, matmul_peak: float | None) -> dict[str, Any]:
    """Run one part in a child process with a hard `budget_s` wall-clock limit."""
    fd, result = tempfile.mkstemp(prefix=f"accel_{name}_", suffix=".json")
    os.close(fd)
    start = time.time()
    cmd = [sys.executable, str(Path(__file__).resolve()), f"--part={name}", f"--result={result}",
           f"--deadline={start + budget_s - 5:.3f}", f"--smoke={_SMOKE.value}",
           f"--sampler_rows={_SAMPLER_ROWS.value}", f"--train_rows={_TRAIN_ROWS.value}",
           f"--new_tokens={_NEW_TOKENS.value}", f"--maze_config={_MAZE_CONFIG.value}",
           f"--maze_steps={_MAZE_STEPS.value}", f"--maze_dtype={_MAZE_DTYPE.value}",
           f"--method={_METHOD.value}", f"--attention={_ATTENTION.value}",
           f"--matmul_peak={matmul_peak or 0.0}"]
    with tempfile.TemporaryFile("w+") as output:
        proc = subprocess.Popen(cmd, stdout=output, stderr=subprocess.STDOUT, cwd=ROOT,
                                start_new_session=True)
        try:
            code = proc.wait(timeout=budget_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # the child's own process group
            proc.wait()
            code = None
        output.seek(0)
        # The last lines, without absl/XLA INFO and WARNING records (e.g. "no libtpu").
        tail = [line.rstrip() for line in output.read().splitlines()
                if line.strip() and not re.match(r"[IW]\d{4} ", line)][-3:]
    elapsed = time.time() - start
    partial: dict[str, Any] = {}
    if os.path.getsize(result):
        with open(result) as f:
            partial = json.load(f)
    for path in (result, result + ".tmp"):
        if os.path.exists(path):
            os.unlink(path)
    out: dict[str, Any] = {"part": name, "elapsed_s": elapsed, **partial}
    if code == 0 and partial.get("final"):
        out["status"] = "ok"
    else:
        why = (f"killed after {budget_s:.0f} s (its budget)" if code is None
               else f"exit code {code}")
        out.update(status="TIMEOUT" if code is None else "FAILED",
                   error=f"{why}; last output: {' | '.join(tail) or '(none)'}" +
                   ("; the numbers are the partial result it saved" if partial else ""))
    return out


def fmt(x: float | None, digits: int = 3) -> str:
    """A number with `digits` significant digits (thousands kept whole), or '–'."""
    if x is None or not math.isfinite(x):
        return "–"
    if abs(x) >= 10 ** (digits - 1):
        return f"{x:,.0f}"
    return f"{x:.{digits}g}"


def table(rows: list[dict[str, Any]], table_peak: float | None,
          matmul_peak: float | None) -> str:
    """The one markdown table (derived columns: TFLOP/s and the two peak fractions)."""
    lines = ["| part | model | shape | dtype | mesh | time (s) | compile (s) | tokens/s "
             "| TFLOP/s | MFU (spec peak) | % of measured matmul peak | status / notes |",
             "|" + "---|" * 12]
    for r in rows:
        ok = r["status"] == "ok"
        rate = r["flops"] / r["time_s"] if r.get("flops") and r.get("time_s") else None
        chips = r.get("chips", 1)
        mfu = 100 * rate / (table_peak * chips) if rate and table_peak else None
        frac = 100 * rate / (matmul_peak * chips) if rate and matmul_peak else None
        r.update(tflops=rate / 1e12 if rate else None, mfu_pct=mfu, measured_peak_pct=frac)
        notes = "; ".join(r.get("notes", []))
        if not ok:
            notes = f"**{r['status']}**: {r['error']}" + (f"; {notes}" if notes else "")
        lines.append("| " + " | ".join([
            r["part"], r.get("model", "–"), r.get("shape", "–"), r.get("dtype", "–"),
            r.get("mesh", "–"), fmt(r.get("time_s")), fmt(r.get("compile_s")),
            fmt(r.get("tokens_per_s")), fmt(r["tflops"]), fmt(mfu, 2), fmt(frac, 2),
            ("ok" + (f"; {notes}" if notes else "")) if ok else notes]) + " |")
    return "\n".join(lines) + "\n"


def main_parent() -> None:
    """Run the parts one after another, print one line per part and then the table."""
    smoke = _SMOKE.value
    unknown = [p for p in _PARTS.value if p not in PARTS]
    if unknown:
        raise app.UsageError(f"--parts {unknown}: choose from {PARTS}")
    limits = budgets(smoke)
    total = (max(_TOTAL.value, sum(limits.values())) if smoke else _TOTAL.value)
    t_start = time.time()
    print(f"accelerator check{' (SMOKE: tiny shapes, numbers mean nothing)' if smoke else ''}"
          f": jax {metadata.version('jax')}, python {sys.version.split()[0]}, total budget "
          f"{total:.0f} s", flush=True)
    results, device, matmul_peak = [], None, None
    for name in PARTS:
        if name not in _PARTS.value:
            results.append({"part": name, "status": "SKIPPED", "error": "not in --parts"})
        else:
            left = total - (time.time() - t_start)
            budget = min(limits[name], left)
            if budget < min(20.0, limits[name]):
                results.append({"part": name, "status": "SKIPPED", "error":
                                f"{left:.0f} s of the {total:.0f} s total budget left"})
            else:
                results.append(launch(name, budget, matmul_peak))
        r = results[-1]
        print(f"[{name}] {r['status']}" + (f" in {r['elapsed_s']:.1f} s" if "elapsed_s" in r
                                           else "") +
              (f": {r['error']}" if r["status"] != "ok" else ""), flush=True)
        if name == "device" and r["status"] == "ok":
            device = r
            matmul_peak = r["flops"] / r["time_s"]
    header = []
    table_peak = None
    if device:
        found = peak_bf16(device["device_kind"])
        table_peak = found[0] if found else None
        mem = device.get("bytes_limit")
        header += [
            f"device: {device['device_kind']} x{device['num_devices']} ({device['platform']}), "
            f"jax {device['jax']}, jaxlib {device['jaxlib']}" +
            (f", {mem / 2**30:.1f} GiB usable per device" if mem else ""),
            "bf16 peak per chip: " + (f"{table_peak / 1e12:,.0f} TFLOP/s ({found[1]}, dense)"
                                       if found else f"no table entry for device kind "
                                       f"{device['device_kind']!r}: 'MFU (spec peak)' is –") +
            f"; measured bf16 matmul ({device['model']}): {matmul_peak / 1e12:.3g} TFLOP/s",
        ]
    else:
        header.append("device part did not succeed: device kind unknown, MFU columns are –")
    text = table(results, table_peak, matmul_peak)
    footer = ("FLOPs: train step = rows * [6 N_blocks S + 6 D V T + 6 L H Dh S (S+1)], sampler "
              "= prefill + decode (benchmarks/bench_common.py); MFU = FLOPs / time / (peak per "
              "chip x chips). Wall time "
              f"{time.time() - t_start:.0f} s.")
    print("\n".join(header) + "\n\n" + text + "\n" + footer, flush=True)
    if _OUT.value:
        Path(_OUT.value).write_text("\n".join(header) + "\n\n" + text + "\n" + footer + "\n")
    if _JSON_OUT.value:
        Path(_JSON_OUT.value).write_text(json.dumps(
            {"smoke": smoke, "header": header, "table_peak": table_peak,
             "matmul_peak": matmul_peak, "parts": results}, indent=1))


def main(argv: list[str]) -> None:
    del argv
    if not _PART.value:
        main_parent()
        return
    emit(run_part(_PART.value, _SMOKE.value, _DEADLINE.value or math.inf) | {"final": True})


if __name__ == "__main__":
    app.run(main)
