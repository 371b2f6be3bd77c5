"""float32 vs bfloat16 on this machine: sampler tokens/s and SFT train-step time of the maze
policy (`models.configs.MAZE_POLICY`: 4 layers, hidden 256), baseline float32 in the same
run.

Sampler variants (compute dtype / KV-cache dtype): float32 / float32 (baseline),
float32 / bfloat16 (`SamplingConfig.cache_dtype`), bfloat16 / bfloat16 (`model.dtype`).
Every row generates exactly `--new_tokens` tokens (no stop token) at temperature 1 after a
`--prompt_len`-token prompt; one call is a warm-up (compile), then `--repeats` timed calls.
Train step: one `sera_jax.sft` step (forward + backward + AdamW on float32 master weights)
over `--train_rows` rows of prompt + answer, compute float32 vs bfloat16. Medians of wall
time and of this process's CPU time are reported with the load average: on a shared
machine the CPU-time ratio is the load-robust one. Most CPUs have no native bfloat16
matmul (XLA converts around the dots; the decoder upcasts the attention contractions on CPU),
so expect little or no speed-up here: bfloat16 is for accelerators, and the bfloat16 KV
cache for its halved memory.

    .venv/bin/python benchmarks/precision_bench.py
"""

from __future__ import annotations

import os

from absl import app, flags
from bench_common import median_timed

_BATCH = flags.DEFINE_integer("batch", 64, "Sampler rows.")
_PROMPT_LEN = flags.DEFINE_integer("prompt_len", 94, "Prompt tokens (9x9 maze: 94).")
_NEW_TOKENS = flags.DEFINE_integer("new_tokens", 32, "Generated tokens per row.")
_TRAIN_ROWS = flags.DEFINE_integer("train_rows", 32, "Rows of one SFT step.")
_REPEATS = flags.DEFINE_integer("repeats", 3, "Timed repeats (median reported).")
_SMALL = flags.DEFINE_bool("small", False, "A 1-layer width-32 policy (tests).")


def main(argv):
    del argv
    import jax
    import jax.numpy as jnp
    import ml_collections
    import numpy as np
    from flax import nnx

    from sera_jax import sft
    from sera_jax.models.configs import MAZE_POLICY
    from sera_jax.models.decoder import Decoder, count_params
    from sera_jax.sampling import SamplingConfig, generate

    cfg = MAZE_POLICY
    if _SMALL.value:
        cfg = cfg.replace(hidden_size=32, intermediate_size=64, num_layers=1, num_heads=2,
                          num_kv_heads=1)
    base = Decoder(cfg, rngs=nnx.Rngs(0))

    def model(dtype):
        m = Decoder(cfg.replace(dtype=dtype), rngs=nnx.Rngs(0))
        # The same float32 weights in every variant (copies: the SFT step donates them).
        nnx.update(m, jax.tree.map(jnp.copy, nnx.state(base)))
        return m

    load_before = os.getloadavg()
    rng = np.random.default_rng(0)
    b, p, t = _BATCH.value, _PROMPT_LEN.value, _NEW_TOKENS.value
    tokens = jnp.asarray(rng.integers(4, cfg.vocab_size, (b, p)), jnp.int32)
    mask = jnp.ones((b, p), bool)
    sampler = {}
    for compute, cache in (("float32", "float32"), ("float32", "bfloat16"),
                           ("bfloat16", "bfloat16")):
        m = model(jnp.dtype(compute))
        config = SamplingConfig(max_new_tokens=t, cache_dtype=cache)
        key = iter(jax.random.split(jax.random.key(1), _REPEATS.value + 1))

        def run(m=m, config=config, key=key):
            out = generate(m, tokens, mask, next(key), config)
            assert int(out.lengths.min()) == t
            return out

        run()  # compile
        sampler[(compute, cache)] = median_timed(run, _REPEATS.value)
        print(f"sampler {compute}/{cache}: {sampler[(compute, cache)]}", flush=True)

    train = {}
    rows, width = _TRAIN_ROWS.value, p + t
    prompts = [rng.integers(4, cfg.vocab_size, p).astype(np.int32) for _ in range(rows)]
    answers = [rng.integers(4, cfg.vocab_size, t).astype(np.int32) for _ in range(rows)]
    sft_cfg = ml_collections.ConfigDict(sft.get_config().to_dict())
    sft_cfg.batch_size, sft_cfg.num_steps = rows, 1000
    for compute in ("float32", "bfloat16"):
        program = sft.SFTProgram(model(jnp.dtype(compute)), sft_cfg,
                                 lambda ids: ([prompts[i] for i in ids], [answers[i] for i in ids]),
                                 rows, width, 0, mesh=None)
        state = {"s": program.init_state(), "step": 0}

        def step(program=program, state=state):
            state["s"], metrics = program.step(state["s"], state["step"])  # metrics: synced
            state["step"] += 1
            assert np.isfinite(metrics["loss"])

        step()  # compile
        train[compute] = median_timed(step, _REPEATS.value)
        floats = {str(x.dtype) for x in jax.tree.leaves(state["s"])
                  if jnp.issubdtype(x.dtype, jnp.floating)}
        print(f"train {compute}: {train[compute]}; state dtypes {sorted(floats)}", flush=True)
    load_after = os.getloadavg()

    print(f"\nMaze policy {cfg.num_layers}x{cfg.hidden_size} ({count_params(base) / 1e6:.2f}M "
          f"params), {jax.devices()[0].platform}, {len(os.sched_getaffinity(0))} CPU core(s), "
          f"load average {load_before[0]:.2f} before / {load_after[0]:.2f} after (1 min); "
          f"median of {_REPEATS.value}. Sampler: {b} rows, prompt {p}, {t} new tokens.\n")
    print("| sampler (compute / KV cache) | tok/s | vs float32 | tok/CPU-s | vs float32 (CPU) |")
    print("|---|---|---|---|---|")
    ref = sampler[("float32", "float32")]
    for (compute, cache), (wall, cpu) in sampler.items():
        print(f"| {compute} / {cache} | {b * t / wall:.0f} | {ref[0] / wall:.2f}x "
              f"| {b * t / cpu:.0f} | {ref[1] / cpu:.2f}x |")
    print(f"\n| SFT step ({rows} x {width} tokens) | ms | speed vs float32 | CPU ms | "
          "speed vs float32 (CPU) |")
    print("|---|---|---|---|---|")
    for compute, (wall, cpu) in train.items():
        print(f"| {compute} | {1e3 * wall:.0f} | {train['float32'][0] / wall:.2f}x "
              f"| {1e3 * cpu:.0f} | {train['float32'][1] / cpu:.2f}x |")


if __name__ == "__main__":
    app.run(main)
