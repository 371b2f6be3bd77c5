"""Rollout throughput of `sera_jax.sampling.generate` vs Hugging Face `transformers` (CPU).

Both sides run the maze policy (`sera_jax.models.configs.MAZE_POLICY`) with the *same*
random weights (written by `save_hf_checkpoint` and read back by
`AutoModelForCausalLM.from_pretrained`), the same batch, prompt length and number of new
tokens, plain sampling at temperature 1 with no stop token (HF: `min_new_tokens =
max_new_tokens`, `top_k=0`), in one process, interleaved repeats, medians reported.

It also measures this machine's float32 matmul peak (best of a few large `jnp.dot`s) and
the fraction of it the sampler reaches, counting useful FLOPs only:

    prefill  R * [2 * N_mm * P + L * 2 * H * Dh * P * (P + 1)]      (causal attention)
    decode   B * sum_{t=1..T-1} [2 * N_mm + L * 4 * H * Dh * (P + t)]

(R prefilled rows: the number of distinct prompts for sera_jax, all B rows for HF, whose
`num_return_sequences` expands the prompts before the prefill)
with N_mm the matmul parameters (attention + MLP projections + the vocabulary head), P the
prompt length, T the new tokens, L layers, H query heads, Dh head size. Attention over
cache slots a step cannot attend yet (a decode phase reads every slot its last step can
reach) is not counted. Both frameworks are credited with the same formula: sera_jax's
prefill skips the last layer's attention output and MLP for all but the last prompt token
(exact: only that token's logits are needed), so its figure is the work HF does per
CPU-second of sera_jax, not FLOPs it executed.

    taskset -c 0 .venv/bin/python benchmarks/sampler_bench.py --batch=8,64,8x8 --repeats=3

Both wall-clock and process CPU time are recorded; on a shared, loaded machine the CPU time
of a single pinned core is the load-robust comparison (`taskset -c 0` gives both frameworks
one core; torch gets `torch.set_num_threads(len(os.sched_getaffinity(0)))`).
"""

from __future__ import annotations

import statistics
import time

from absl import app, flags
from bench_common import (
    hf_model,
    hf_sample,
    matmul_peak_flops,
    sampler_flops,
    torch_threads,
    write_report,
)

_BATCH = flags.DEFINE_list(
    "batch", ["8", "64", "8x8"],
    "Batch shapes: 'B' = B distinct prompts; 'PxN' = P prompts x N samples each (the RL "
    "rollout shape: sera_jax prefills each prompt once via segment_ids, HF uses "
    "num_return_sequences=N).",
)
_PROMPT_LEN = flags.DEFINE_integer("prompt_len", 310, "Prompt tokens (17x17 maze: 310).")
_NEW_TOKENS = flags.DEFINE_integer("new_tokens", 180, "Generated tokens per row.")
_REPEATS = flags.DEFINE_integer("repeats", 3, "Timed repeats per side (median reported).")
_SEED = flags.DEFINE_integer("seed", 0, "Weights / prompts / sampling seed.")
_OUT = flags.DEFINE_string("out", "", "Optional path: write the markdown table there.")


def main(argv):
    del argv
    import jax
    import jax.numpy as jnp
    import numpy as np
    import torch
    import transformers
    from flax import nnx

    from sera_jax.models.configs import MAZE_POLICY
    from sera_jax.models.decoder import Decoder, count_params
    from sera_jax.sampling import SamplingConfig, generate

    threads = torch_threads()
    cfg = MAZE_POLICY
    model = Decoder(cfg, rngs=nnx.Rngs(_SEED.value))
    hf = hf_model(model)
    p_len, t_new = _PROMPT_LEN.value, _NEW_TOKENS.value
    peak, peak_cpu = matmul_peak_flops()
    print(f"jax {jax.__version__} ({jax.devices()[0].platform}), torch {torch.__version__}, "
          f"transformers {transformers.__version__}, {threads} CPU core(s); "
          f"model {cfg.name}: {count_params(model) / 1e6:.2f}M params, HF class "
          f"{type(hf).__name__}; float32 matmul peak {peak / 1e9:.1f} GFLOP/s "
          f"(wall), {peak_cpu / 1e9:.1f} GFLOP/CPU-s")

    rng = np.random.default_rng(_SEED.value)
    rows = []
    for shape in _BATCH.value:
        num_prompts, samples = (int(x) for x in shape.split("x")) if "x" in shape else (
            int(shape), 1)
        batch = num_prompts * samples
        prompts = rng.integers(4, cfg.vocab_size, size=(num_prompts, p_len), dtype=np.int32)
        tokens, mask = jnp.asarray(prompts), jnp.ones((num_prompts, p_len), bool)
        segment_ids = jnp.repeat(jnp.arange(num_prompts), samples) if samples > 1 else None
        ids = torch.from_numpy(prompts.astype(np.int64))
        n = min(2, num_prompts)
        with torch.inference_mode():  # same model on both sides: compare prompt logits
            ref = hf(input_ids=ids[:n]).logits.numpy()
        ours = np.asarray(model(tokens[:n], jnp.broadcast_to(jnp.arange(p_len), (n, p_len)))[0])
        logit_diff = float(np.abs(ref - ours).max())

        sconfig = SamplingConfig(max_new_tokens=t_new, temperature=1.0)
        key = jax.random.key(_SEED.value)

        def run_jax(key, tokens=tokens, mask=mask, segment_ids=segment_ids, sconfig=sconfig):
            out = generate(model, tokens, mask, key, sconfig, segment_ids=segment_ids)
            out.tokens.block_until_ready()
            return out

        def run_hf(new_tokens, ids=ids, samples=samples):
            return hf_sample(hf, ids, torch.ones_like(ids), new_tokens=new_tokens,
                             samples=samples)

        start = time.perf_counter()
        run_jax(key)
        compile_s = time.perf_counter() - start
        run_hf(4)  # warm-up
        times = {"jax": [], "hf": []}
        for r in range(_REPEATS.value):
            for name in ("jax", "hf"):
                wall, cpu = time.perf_counter(), time.process_time()
                result = run_jax(jax.random.fold_in(key, r + 1)) if name == "jax" else run_hf(t_new)
                times[name].append((time.perf_counter() - wall, time.process_time() - cpu))
                if name == "jax":
                    assert int(result.lengths.min()) == t_new
                else:
                    assert result.shape == (batch, p_len + t_new), result.shape
        med = {
            name: [statistics.median(t[i] for t in ts) for i in (0, 1)]
            for name, ts in times.items()
        }
        flops = sampler_flops(cfg, num_prompts, batch, p_len, t_new)
        hf_flops = sampler_flops(cfg, batch, batch, p_len, t_new)
        row = dict(
            shape=shape if samples > 1 else str(batch), batch=batch,
            jax_wall=batch * t_new / med["jax"][0], hf_wall=batch * t_new / med["hf"][0],
            jax_cpu=batch * t_new / med["jax"][1], hf_cpu=batch * t_new / med["hf"][1],
            frac_peak=flops / med["jax"][1] / peak_cpu,
            hf_frac_peak=hf_flops / med["hf"][1] / peak_cpu, compile_s=compile_s,
        )
        rows.append(row)
        print(f"batch {shape}: (wall s, cpu s) jax {[f'{a:.2f},{b:.2f}' for a, b in times['jax']]}"
              f" hf {[f'{a:.2f},{b:.2f}' for a, b in times['hf']]}; compile {compile_s:.1f} s;"
              f" prompt-logit max|diff| {logit_diff:.1e}", flush=True)

    header = (
        f"Maze policy ({count_params(model) / 1e6:.2f}M params), prompt {p_len} tokens, "
        f"{t_new} new tokens per row, float32, sampling at T=1, {threads} CPU core(s), "
        f"median of {_REPEATS.value} runs. tok/s = generated tokens per second "
        "(wall clock, and per CPU-second of the process).\n\n"
        "| batch (rows) | sera_jax tok/s | HF tok/s | speed-up | sera_jax tok/CPU-s "
        "| HF tok/CPU-s | speed-up (CPU) | sera_jax % of peak | HF % of peak |\n"
        "|---|---|---|---|---|---|---|---|---|\n"
    )
    table = header + "".join(
        f"| {r['shape']} ({r['batch']}) | {r['jax_wall']:.0f} | {r['hf_wall']:.0f} "
        f"| {r['jax_wall'] / r['hf_wall']:.2f}x | {r['jax_cpu']:.0f} | {r['hf_cpu']:.0f} "
        f"| {r['jax_cpu'] / r['hf_cpu']:.2f}x | {100 * r['frac_peak']:.0f}% "
        f"| {100 * r['hf_frac_peak']:.0f}% |\n"
        for r in rows
    )
    table += (
        f"\nPeak = best float32 jnp.dot 2048^3 in the same process: {peak_cpu / 1e9:.1f} "
        f"GFLOP per CPU-second ({peak / 1e9:.1f} GFLOP/s wall). '% of peak' = useful FLOPs "
        "(module docstring) per CPU-second / that peak.\n"
    )
    write_report(table, _OUT.value)


if __name__ == "__main__":
    app.run(main)
