"""SERA inside google-tunix (0.1.7): `SeraLearner`, the `maxrl` estimator, a CPU example.

Importing this package checks the tunix version first (ImportError naming the supported
one), then registers ``maxrl`` in tunix's advantage-estimator registry. See
`sera_jax.integrations.tunix.learner` for the learner and docs/tunix.md for usage.

Modules: `learner` (`SeraLearner`, a drop-in for tunix's `GRPOLearner`, and the `maxrl`
estimator), `example` (the CPU example of experiments/tunix_sera.py), `smollm2` (the embedded
SmolLM2-135M-Instruct in tunix's Llama-3, with the rope-theta fix), `real_model` (its policy,
prompts and the gradient check against this package's trainer), `_version` (the supported
tunix). Nothing else in sera_jax imports this package (it needs the `tunix` extra).
"""

from sera_jax.integrations.tunix._version import (
    SUPPORTED_TUNIX_VERSIONS,
    check_tunix_version,
)

check_tunix_version()

from sera_jax.integrations.tunix.learner import (  # noqa: E402
    CHECKPOINT_KEY,
    TUNIX_VERSION,
    SeraLearner,
    SeraOptions,
    maxrl_advantages,
    validate,
)

__all__ = ["CHECKPOINT_KEY", "SUPPORTED_TUNIX_VERSIONS", "TUNIX_VERSION", "SeraLearner",
           "SeraOptions", "check_tunix_version", "maxrl_advantages", "validate"]
