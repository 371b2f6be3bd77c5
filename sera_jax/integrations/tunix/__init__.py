"""SERA inside google-tunix (0.1.7): `SeraLearner`, the `maxrl` estimator, a CPU example.

Importing this package checks the tunix version first (ImportError naming the supported
one), then registers ``maxrl`` in tunix's advantage-estimator registry. See
`sera_jax.integrations.tunix.learner` for the learner and docs/tunix.md for usage.
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
