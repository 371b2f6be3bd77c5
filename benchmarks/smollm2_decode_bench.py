"""SmolLM2-135M-Instruct decode throughput of `sera_jax.sampling.generate`, new vs old token draw.

One process, one model, one batch: the sampler with `SamplingConfig(token_draw="fast")`
(`sera_jax.sampling_draw`, the default) and with `token_draw="reference"` (the draw code
before it: `jax.random.categorical`, `jnp.argmax`, two `log_softmax`es), interleaved
repeats, medians. Each path is timed at `--new_tokens` T and at 1 new token (prefill + the
first draw); decode = the difference, T - 1 steps of `--batch` rows. Both paths must give the
same tokens for the same key (checked).

Decode FLOPs are the useful ones of `bench_common.sampler_flops` without the prefill,

    decode = B * sum_{t=1..T-1} [2 * N_mm + L * 4 * H * Dh * (P + t)]

(N_mm = matmul parameters incl. the 49k-vocabulary head), over the process CPU seconds
(load-robust on a shared machine; `taskset -c 1` pins one core), as a fraction of this
process's float32 matmul peak (`bench_common.matmul_peak_flops`, best `jnp.dot` 2048^3).

    nice -n 19 taskset -c 1 .venv/bin/python benchmarks/smollm2_decode_bench.py \
        --batch=64 --prompt_len=128 --new_tokens=64 --repeats=3

`--model=maze` runs the same measurement on the random-weight maze policy (smoke tests).
"""

from __future__ import annotations

import statistics
import time

from absl import app, flags
from bench_common import cpu_name, load_text, matmul_peak_flops, sampler_flops, write_report

_MODEL = flags.DEFINE_enum("model", "smollm2", ["smollm2", "maze"],
                           "smollm2: the embedded GGUF (float32); maze: random MAZE_POLICY.")
_BATCH = flags.DEFINE_integer("batch", 64, "Rows (distinct random prompts).")
_PROMPT_LEN = flags.DEFINE_integer("prompt_len", 128, "Prompt tokens per row.")
_NEW_TOKENS = flags.DEFINE_integer("new_tokens", 64, "Generated tokens per row (no stop).")
_TEMPERATURE = flags.DEFINE_float("temperature", 1.0, "Sampling temperature.")
_TOP_P = flags.DEFINE_float("top_p", 1.0, "Nucleus mass (1 = off).")
_REPEATS = flags.DEFINE_integer("repeats", 3, "Timed repeats per path and length.")
_DRAWS = flags.DEFINE_list(
    "draws", ["reference", "fast", "inverse_cdf"],
    "SamplingConfig.token_draw values to time; 'reference' (today's draw) is the baseline.")
_OUT = flags.DEFINE_string("out", "", "Optional path: write the markdown report there.")


def main(argv):
    del argv
    import jax
    import jax.numpy as jnp
    import numpy as np
    from flax import nnx

    from sera_jax.sampling import SamplingConfig, generate

    if _MODEL.value == "smollm2":
        from sera_jax.models.embedded import load_smollm2

        model, _ = load_smollm2()
    else:
        from sera_jax.models.configs import MAZE_POLICY
        from sera_jax.models.decoder import Decoder

        model = Decoder(MAZE_POLICY, rngs=nnx.Rngs(0))
    cfg = model.cfg
    b, p_len, t_new = _BATCH.value, _PROMPT_LEN.value, _NEW_TOKENS.value
    if t_new < 2:
        raise app.UsageError("--new_tokens must be >= 2 (decode = T - 1 steps)")
    paths = tuple(_DRAWS.value)
    if paths[0] != "reference":
        raise app.UsageError("--draws must start with 'reference' (the baseline)")
    peak, peak_cpu = matmul_peak_flops()
    rng = np.random.default_rng(0)
    tokens = jnp.asarray(rng.integers(4, cfg.vocab_size, size=(b, p_len), dtype=np.int32))
    mask = jnp.ones((b, p_len), bool)
    configs = {
        (path, steps): SamplingConfig(max_new_tokens=steps, temperature=_TEMPERATURE.value,
                                      top_p=_TOP_P.value, token_draw=path)
        for path in paths for steps in (1, t_new)
    }

    def call(name, key):
        out = generate(model, tokens, mask, key, configs[name])
        out.tokens.block_until_ready()
        return out

    compile_s, outs = {}, {}
    for name in configs:
        start = time.perf_counter()
        outs[name] = call(name, jax.random.key(0))
        compile_s[name] = time.perf_counter() - start
    # "fast" must draw the reference's tokens; "inverse_cdf" draws other ones by design.
    fast = "fast" if "fast" in paths else "reference"
    same = all(bool(jnp.all(outs[(fast, s)].tokens == outs[("reference", s)].tokens))
               for s in (1, t_new))
    lp_diff = float(jnp.max(jnp.abs(outs[(fast, t_new)].logprobs
                                    - outs[("reference", t_new)].logprobs)))
    times = {name: [] for name in configs}
    for r in range(_REPEATS.value):
        for name in configs:  # interleaved: load drifts hit both paths alike
            wall, cpu = time.perf_counter(), time.process_time()
            call(name, jax.random.key(r + 1))
            times[name].append((time.perf_counter() - wall, time.process_time() - cpu))
    med = {name: [statistics.median(t[i] for t in ts) for i in (0, 1)]
           for name, ts in times.items()}
    flops = sampler_flops(cfg, 0, b, p_len, t_new)  # decode only (no prefilled rows)
    rows = {}
    for path in paths:
        wall = med[(path, t_new)][0] - med[(path, 1)][0]
        cpu = med[(path, t_new)][1] - med[(path, 1)][1]
        rows[path] = dict(step_ms=1e3 * cpu / (t_new - 1), wall_ms=1e3 * wall / (t_new - 1),
                          gflops=flops / cpu / 1e9, frac=flops / cpu / peak_cpu)
    ref = rows["reference"]
    draw = (f"T = {_TEMPERATURE.value:g}" + (f", top-p {_TOP_P.value:g}" if _TOP_P.value < 1
                                             else ", no filter"))
    text = (
        f"{cfg.name} float32, {b} rows x prompt {p_len} + {t_new} new tokens (no stop), "
        f"sampling {draw}; jax {jax.__version__}; {cpu_name()}; {load_text()} at the end; "
        f"float32 matmul peak {peak_cpu / 1e9:.1f} GFLOP/CPU-s ({peak / 1e9:.1f} GFLOP/s "
        f"wall); decode {flops / 1e9 / (t_new - 1):.2f} useful GFLOP per step; medians of "
        f"{_REPEATS.value}, interleaved; fast and reference draw the same tokens: {same}, max "
        f"|logprob diff| {lp_diff:.1e}.\n\n"
        "| token draw | decode CPU ms / step | wall ms / step | GFLOP per CPU-s "
        "| % of f32 peak | speed-up (CPU) |\n|---|---|---|---|---|---|\n"
        + "".join(f"| {path}{' (today)' if path == 'reference' else ''} | {r['step_ms']:.1f} "
                  f"| {r['wall_ms']:.1f} | {r['gflops']:.1f} | {100 * r['frac']:.1f}% "
                  f"| {ref['step_ms'] / r['step_ms']:.2f}x |\n"
                  for path, r in rows.items())
        + "\nSpeed-up = reference CPU ms per decode step / this draw's. Raw (wall s, CPU s): "
        + "; ".join(f"{p} T={s}: " + ", ".join(f"{w:.2f}/{c:.2f}" for w, c in times[(p, s)])
                    for p, s in configs)
        + ". Compile + first call (s): "
        + ", ".join(f"{p} T={s} {compile_s[(p, s)]:.0f}" for p, s in configs) + ".\n"
    )
    write_report(text, _OUT.value)


if __name__ == "__main__":
    app.run(main)
