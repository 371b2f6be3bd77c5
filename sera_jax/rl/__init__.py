"""On-policy RL trainer (history -> allocate -> sample -> verify -> advantages -> AdamW).

`sera_jax.rl.config.get_config()` holds the defaults; `sera_jax.rl.trainer.run` trains with
automatic resume; `sera_jax.rl.evaluate.evaluate` measures pass@k.
"""
