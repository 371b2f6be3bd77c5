"""SHA-256 verification of weight files, where a checksum exists.

A flipped byte inside a tensor's data usually leaves a finite value: the loaders' NaN /
Inf check cannot see it, only a checksum can. The safetensors format and its
`model.safetensors.index.json` carry none (the index maps names to files), and neither does
GGUF. Two sources exist in practice, and both are verified before a file is read:

* a sidecar `<file>.sha256` (the `sha256sum` format: the hex digest, optionally followed
  by the file name), written by whoever distributes the weights;
* the Hugging Face hub cache: `snapshots/<rev>/<file>` is a link to `blobs/<sha256>`, the
  digest of the (LFS) file's content, so the blob's own name is its checksum.

A file with neither is read unverified (`verify_file` returns False): a flipped data byte
that stays finite loads silently. Hashing reads the whole file once (about 1 s per GB).
"""

from __future__ import annotations

import hashlib
import os
import re

_HEX64 = re.compile(r"[0-9a-fA-F]{64}")


def expected_sha256(file: str | os.PathLike) -> tuple[str, str] | None:
    """`(hex digest, where it came from)` for `file`, or None when no checksum exists.

    ValueError naming the sidecar when `<file>.sha256` exists but holds no digest.
    """
    file = os.fspath(file)
    sidecar = file + ".sha256"
    if os.path.isfile(sidecar):
        with open(sidecar, encoding="utf-8", errors="replace") as f:
            words = f.read().split()
        if not words or not _HEX64.fullmatch(words[0]):
            raise ValueError(f"{sidecar}: not a sha256 checksum file (expected 64 hex digits, "
                             f"as `sha256sum` writes); fix or delete it")
        return words[0].lower(), sidecar
    real = os.path.realpath(file)
    parent, name = os.path.split(real)
    if os.path.basename(parent) == "blobs" and _HEX64.fullmatch(name):
        return name.lower(), f"the hub cache blob name {real}"
    return None


def sha256_of(file: str | os.PathLike, chunk: int = 1 << 23) -> str:
    """Hex SHA-256 of the file's bytes (streamed, 8 MiB at a time)."""
    digest = hashlib.sha256()
    with open(file, "rb") as f:
        while block := f.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def verify_file(file: str | os.PathLike) -> bool:
    """True when `file` matches its checksum, False when it has none (unverified);
    ValueError naming the file, the checksum's source and the fix on a mismatch."""
    expected = expected_sha256(file)
    if expected is None:
        return False
    digest, source = expected
    actual = sha256_of(file)
    if actual != digest:
        raise ValueError(
            f"{os.fspath(file)}: sha256 {actual} does not match {digest} from {source}: the "
            "file is corrupt (a changed or flipped byte). Fix: delete it and re-download it"
        )
    return True


__all__ = ["expected_sha256", "sha256_of", "verify_file"]
