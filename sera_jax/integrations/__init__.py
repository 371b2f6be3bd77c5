"""Adapters that put SERA into other RL frameworks.

`sera_jax.integrations.tunix`: a drop-in learner for google-tunix's RL cluster and a
`maxrl` advantage estimator in tunix's registry (needs `pip install '.[tunix]'` from a clone;
imported on demand, so `import sera_jax` never requires tunix).
"""
