"""The tunix version gate (no tunix import here, so it runs before tunix is touched)."""

from __future__ import annotations

import importlib.metadata
import os

#: The google-tunix releases this integration is written and tested against.
SUPPORTED_TUNIX_VERSIONS = ("0.1.7",)
UNCHECKED_ENV = "SERA_JAX_TUNIX_UNCHECKED"


def check_tunix_version(version: str | None = None) -> str:
    """The installed google-tunix version (or `version`); ImportError naming the supported
    one unless it is in `SUPPORTED_TUNIX_VERSIONS` (or `$SERA_JAX_TUNIX_UNCHECKED` is set)."""
    supported = SUPPORTED_TUNIX_VERSIONS[-1]
    if version is None:
        try:
            version = importlib.metadata.version("google-tunix")
        except importlib.metadata.PackageNotFoundError:
            raise ImportError(f"sera_jax.integrations.tunix needs google-tunix=={supported}: "
                              f"pip install 'google-tunix=={supported}' (from a clone of sera_jax: "
                              "pip install '.[tunix]')") from None
    if version not in SUPPORTED_TUNIX_VERSIONS and not os.environ.get(UNCHECKED_ENV):
        raise ImportError(
            f"sera_jax.integrations.tunix supports google-tunix=={supported} (tested: "
            f"{', '.join(SUPPORTED_TUNIX_VERSIONS)}); found {version}. Install the supported "
            f"one (pip install 'google-tunix=={supported}', or '.[tunix]' from a clone of "
            f"sera_jax), or set "
            f"{UNCHECKED_ENV}=1 to try {version} unsupported.")
    return version
