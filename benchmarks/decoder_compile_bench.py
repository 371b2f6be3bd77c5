"""Compile time and steady-state time of the decoder's programs: unrolled layers vs
`DecoderConfig.scan_layers` (one `lax.scan` over stacked layers), side by side in one run.

Both layouts hold the *same* random weights (`convert_layout`), so each program's outputs
are compared too (the `check` column). Programs, each jitted and then lowered + compiled
ahead of time (the compile time is `lower` + `compile`; the steady-state time calls the
compiled executable, median of `--repeats`, the two layouts interleaved):

    forward      token_logprobs of a [B, T] batch (the trainer's log-likelihood forward)
    train step   value_and_grad of a token-logprob loss + an SGD update (params donated)
    decode step  one token for B rows against an S-slot KV cache (cache donated); its
                 steady time is per step
    sampler      sampling.generate: prefill of [B, W] prompts + N new tokens (the whole
                 jitted program: prefill, decode phases and sampling)

The issue's target (sera_jax issue #15, item 2): a 30-layer model compiles in at most a third
of the unrolled time, with no slower steady state. Default size: SmolLM2-135M-shaped
(`sera_jax.models.configs.SMOLLM2_135M`, 30 layers) with random weights:

    .venv/bin/python benchmarks/decoder_compile_bench.py            # full size
    .venv/bin/python benchmarks/decoder_compile_bench.py --small    # seconds: a smoke run

Wall and process CPU seconds are both recorded (`wall (cpu)`); the machine's load average
(`os.getloadavg`) is printed before and after, since on a shared machine wall time moves
with other processes' load.
"""

from __future__ import annotations

import functools
import statistics

from absl import app, flags
from bench_common import cpu_name, load_text, timed, write_report

_PRESET = flags.DEFINE_string("preset", "smollm2_135m", "sera_jax.models.configs preset.")
_LAYERS = flags.DEFINE_integer("num_layers", 0, "Override the preset's layer count (0: keep).")
_SMALL = flags.DEFINE_bool(
    "small", False, "Smoke size: a 2-layer width-32 model over 128 tokens, tiny batches, "
    "1 repeat (overrides the size flags).")
_BATCH = flags.DEFINE_integer("batch", 2, "Rows of every program.")
_SEQ_LEN = flags.DEFINE_integer("seq_len", 32, "Tokens per row of the forward / train step.")
_PROMPT_LEN = flags.DEFINE_integer("prompt_len", 32, "Prompt tokens of the sampler.")
_NEW_TOKENS = flags.DEFINE_integer("new_tokens", 16, "New tokens of the sampler.")
_DECODE_STEPS = flags.DEFINE_integer("decode_steps", 8, "Decode steps per timed repeat.")
_REPEATS = flags.DEFINE_integer("repeats", 3, "Timed repeats per layout (median reported).")
_SEED = flags.DEFINE_integer("seed", 0, "Weights / data seed.")
_OUT = flags.DEFINE_string("out", "", "Optional path: write the markdown table there too.")


def main(argv):
    del argv
    import jax
    import jax.numpy as jnp
    import numpy as np
    from flax import nnx

    from sera_jax import sampling
    from sera_jax.models import configs
    from sera_jax.models.decoder import (
        Decoder,
        DecoderConfig,
        convert_layout,
        count_params,
        init_cache,
    )
    from sera_jax.models.logprobs import token_logprobs

    if _SMALL.value:
        cfg = DecoderConfig(
            name="smoke", vocab_size=128, hidden_size=32, intermediate_size=64, num_layers=2,
            num_heads=4, num_kv_heads=2, rope_theta=10_000.0)
        batch, seq_len, prompt_len, new_tokens, decode_steps, repeats = 2, 16, 8, 6, 2, 1
    else:
        cfg = configs.get_config(_PRESET.value)
        if _LAYERS.value:
            cfg = cfg.replace(num_layers=_LAYERS.value)
        batch, seq_len, prompt_len = _BATCH.value, _SEQ_LEN.value, _PROMPT_LEN.value
        new_tokens, decode_steps, repeats = (_NEW_TOKENS.value, _DECODE_STEPS.value,
                                             _REPEATS.value)
    load_before = load_text()
    unrolled = Decoder(cfg.replace(scan_layers=False), rngs=nnx.Rngs(_SEED.value))
    models = {"unrolled": unrolled, "scanned": convert_layout(unrolled, scan_layers=True)}

    rng = np.random.default_rng(_SEED.value)
    tokens = jnp.asarray(rng.integers(0, cfg.vocab_size, (batch, seq_len)), jnp.int32)
    mask = jnp.ones((batch, seq_len), bool)
    prompts = jnp.asarray(rng.integers(0, cfg.vocab_size, (batch, prompt_len)), jnp.int32)
    prompt_mask = jnp.ones((batch, prompt_len), bool)
    sconfig = sampling.SamplingConfig(max_new_tokens=new_tokens, temperature=1.0)
    row_keys = sampling.default_row_keys(jax.random.key(_SEED.value), batch)
    cache_slots = prompt_len + new_tokens
    decode_tokens = jnp.asarray(rng.integers(0, cfg.vocab_size, (batch, 1)), jnp.int32)

    def make_programs(model):
        """name -> (jitted function, arguments, static keyword arguments) for one layout."""
        graphdef, state = nnx.split(model)

        def forward(s, t, m):
            return token_logprobs(nnx.merge(graphdef, s), t, m)

        def train_step(s, t, m):
            loss, grads = jax.value_and_grad(lambda s: -jnp.mean(forward(s, t, m)))(s)
            return jax.tree.map(lambda p, g: p - 1e-4 * g, s, grads), loss

        def decode(s, tok, pos, cache):
            return nnx.merge(graphdef, s)(tok, pos, cache)

        return {
            "forward": (jax.jit(forward), (state, tokens, mask), {}),
            "train step": (jax.jit(train_step, donate_argnums=0),
                           (jax.tree.map(jnp.copy, state), tokens, mask), {}),
            "decode step": (jax.jit(decode, donate_argnums=3),
                            (state, decode_tokens, jnp.full((batch, 1), prompt_len, jnp.int32),
                             init_cache(model.cfg, batch, cache_slots)), {}),
            # The sampler's own jitted program (prefill + decode phases); graphdef is static.
            "sampler": (sampling._generate_jit,
                        (graphdef, state, prompts, prompt_mask, None, row_keys, None),
                        {"config": sconfig}),
        }

    def call(name, compiled, args):
        """One timed unit of work: returns the output to compare and threads donated
        buffers (train state, KV cache) back into `args`."""
        if name == "train step":
            args[0], loss = compiled(*args)
            return jax.block_until_ready(loss)
        if name == "decode step":
            for _ in range(decode_steps):
                logits, args[3] = compiled(*args)
            return jax.block_until_ready(logits)
        out = compiled(*args)
        return jax.block_until_ready(out[0].tokens if name == "sampler" else out)

    specs = {layout: make_programs(model) for layout, model in models.items()}
    rows = []
    for name in specs["unrolled"]:
        compiled, args, comp = {}, {}, {}
        for layout in models:
            fn, a, static = specs[layout][name]
            lowered, lower_wall, lower_cpu = timed(lambda fn=fn, a=a, k=static:
                                                    fn.lower(*a, **k))
            compiled[layout], comp_wall, comp_cpu = timed(lowered.compile)
            comp[layout] = (lower_wall + comp_wall, lower_cpu + comp_cpu)
            # The executable takes the non-static arguments only (not the graphdef).
            args[layout] = list(a[1:] if name == "sampler" else a)
        outputs = {layout: np.asarray(call(name, compiled[layout], args[layout]))
                   for layout in models}  # the warm-up call
        times = {layout: [] for layout in models}
        per = decode_steps if name == "decode step" else 1
        for _ in range(repeats):
            for layout in models:  # interleaved: load changes hit both layouts alike
                _, wall, cpu = timed(functools.partial(call, name, compiled[layout],
                                                        args[layout]))
                times[layout].append((wall / per, cpu / per))
        if name == "sampler":
            check = "same tokens" if np.array_equal(outputs["unrolled"],
                                                    outputs["scanned"]) else "TOKENS DIFFER"
        else:
            diff = float(np.max(np.abs(outputs["unrolled"] - outputs["scanned"])))
            scale = float(np.max(np.abs(outputs["unrolled"]))) or 1.0
            check = f"max rel diff {diff / scale:.1e}" + ("" if diff <= 1e-4 * scale
                                                          else " TOO LARGE")
        steady = {k: (statistics.median(w for w, _ in t), statistics.median(c for _, c in t))
                  for k, t in times.items()}
        rows.append((name, comp, steady, check))
        print(f"{name}: compile s unrolled {comp['unrolled'][0]:.2f}, scanned "
              f"{comp['scanned'][0]:.2f}; steady ms unrolled {1e3 * steady['unrolled'][0]:.1f}"
              f", scanned {1e3 * steady['scanned'][0]:.1f}; {check}; {load_text()}", flush=True)

    header = (f"decoder {cfg.name}: {cfg.num_layers} layers, {count_params(unrolled) / 1e6:.1f}M "
              f"params, {jnp.dtype(cfg.dtype).name}; batch {batch}, forward/train T={seq_len}, "
              f"sampler {prompt_len}+{new_tokens} tokens, decode cache {cache_slots} slots; "
              f"jax {jax.__version__} on {jax.devices()[0].platform} "
              f"({len(jax.devices())} device(s)); {cpu_name()}")
    lines = [
        header,
        f"before: {load_before}; after: {load_text()}",
        "",
        "| program | unrolled compile s wall (cpu) | scanned compile s wall (cpu) | compile "
        "scanned/unrolled (wall) | unrolled steady ms wall (cpu) | scanned steady ms wall "
        "(cpu) | steady scanned/unrolled (wall) | check |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, comp, steady, check in rows:
        u, s = comp["unrolled"], comp["scanned"]
        su, ss = steady["unrolled"], steady["scanned"]
        lines.append(
            f"| {name} | {u[0]:.2f} ({u[1]:.2f}) | {s[0]:.2f} ({s[1]:.2f}) | "
            f"{s[0] / u[0]:.2f} | {1e3 * su[0]:.1f} ({1e3 * su[1]:.1f}) | "
            f"{1e3 * ss[0]:.1f} ({1e3 * ss[1]:.1f}) | {ss[0] / su[0]:.2f} | {check} |")
    total_u = sum(c["unrolled"][0] for _, c, _, _ in rows)
    total_s = sum(c["scanned"][0] for _, c, _, _ in rows)
    lines.append(f"| all four | {total_u:.2f} | {total_s:.2f} | {total_s / total_u:.2f} | | | "
                 "| |")
    write_report("\n".join(lines), _OUT.value)


if __name__ == "__main__":
    app.run(main)
