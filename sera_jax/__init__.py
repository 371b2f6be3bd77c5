"""sera_jax: Scale-Equalized Rollout Allocation for maximum-likelihood RL, in JAX."""

__version__ = "0.1.0"
