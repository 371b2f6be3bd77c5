"""On-policy RL trainer (history -> allocate -> sample -> verify -> advantages -> AdamW).

`sera_jax.rl.config.get_config()` holds the defaults and the method resolution;
`sera_jax.rl.trainer.Trainer` is one step (run it with `sera_jax.loop` via `RLProgram`);
`sera_jax.rl.evaluate.evaluate` measures pass@k.
"""
