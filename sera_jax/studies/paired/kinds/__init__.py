"""Task kinds: everything the paired protocol needs to know about a task, behind one interface.

The protocol (spec, stages, evaluation, statistics, reports, frontier, export) knows no task.
A *kind* supplies what differs between tasks:

* building: `build_task(cfg)`, `build_model(cfg, mesh)` (the start's graph), the evaluation
  sampler `eval_sampling(cfg, task)` and the start's fingerprint `start_fingerprint(cfg)`;
* the start stage: `train_start(cfg, start_dir, mesh, workdir)` (SFT from scratch, or
  nothing for a pretrained model) and `load_start(cfg, start_dir, mesh)` / `start_step`;
* the blind control: `blind_validity(task, split, num_prompts, ks)`, the exact pass@k of a
  policy that ignores the prompt, with the common keys of `BLIND_KEYS`;
* validation of the blocks it owns (`validate(cfg)`: task, model, start);
* `test_split(cfg)`: the fields of its task's sealed test split (None: it has none);
* `words`: the nouns the reports use (`Words`), so no protocol module rewrites text.

Adding a kind is one module: subclass `Kind`, decorate it with `@register`, import it below
(tests/studies/paired/kinds/test_kinds.py registers a toy kind in a test). A config names its
kind in `config.kind`; configs written before that field are resolved by `kind_name`.
"""

from __future__ import annotations

import ml_collections

from sera_jax.studies import common
from sera_jax.studies.paired.kinds import lm, maze
from sera_jax.studies.paired.kinds.base import BLIND_KEYS, KINDS, Kind, Words, register


def kind_name(cfg: ml_collections.ConfigDict) -> str:
    """`config.kind`; a config without it is `math` when its model names a pretrained
    `source`, else `maze` (the configs written before kinds)."""
    if cfg.get("kind"):
        return str(cfg.kind)
    return "math" if cfg.get("model") is not None and cfg.model.get("source") else "maze"


def get_kind(cfg_or_name: ml_collections.ConfigDict | str) -> Kind:
    """The `Kind` of a config (`kind_name`) or of a name; StudyError naming the choices."""
    name = cfg_or_name if isinstance(cfg_or_name, str) else kind_name(cfg_or_name)
    if name not in KINDS:
        raise common.StudyError(f"config.kind={name!r}; choose from {sorted(KINDS)}")
    return KINDS[name]


def words(name: str | None) -> Words:
    """The `Words` of the kind a table was made by (`table["study"]`; None = maze)."""
    return get_kind(name or "maze").words


__all__ = ["BLIND_KEYS", "KINDS", "Kind", "Words", "get_kind", "kind_name", "lm", "maze",
           "register", "words"]
