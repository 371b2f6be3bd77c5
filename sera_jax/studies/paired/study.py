"""The paired study's entry point: `run(config, workdir, stage, methods, seeds)` (the package
docstring has the stages and the workdir layout): resolve the config once
(`config.resolve`), then run the stage with the resolved plan."""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from typing import Any

import jax
import ml_collections
from absl import logging

from sera_jax import methods as methods_lib
from sera_jax.records import log_timing
from sera_jax.rl import trainer as trainer_lib
from sera_jax.studies import common
from sera_jax.studies.paired.config import NEEDS_START, RL_STAGES, resolve
from sera_jax.studies.paired.curves import preregister
from sera_jax.studies.paired.export import export_results
from sera_jax.studies.paired.frontier import frontier_markdown, stage_frontier
from sera_jax.studies.paired.matched import RULES, matched_markdown, stage_matched
from sera_jax.studies.paired.prereg import (
    check_preregistration,
    require_committed,
    write_amendment,
    write_preregistration,
)
from sera_jax.studies.paired.regime import regime_markdown, stage_regime
from sera_jax.studies.paired.report import aggregate, comparison_markdown
from sera_jax.studies.paired.spec import EXPLORATORY, STAGES, make_mesh
from sera_jax.studies.paired.stages import run_plan, stage_sft
from sera_jax.studies.paired.validity import require_readable


def run(cfg: ml_collections.ConfigDict, workdir: str, stage: str = "all",
        methods: Sequence[str | methods_lib.Method] | None = None,
        seeds: Sequence[int | str] | None = None) -> dict[str, Any] | None:
    """Run one stage (see the package docstring) after resolving everything
    (`config.resolve`); returns the aggregate for the eval stages (the record / output of
    preregister, matched, norm_matched, export).

    `methods`: names of `sera_jax.methods.METHODS` or its `Method` presets (the binary's
    `--methods`); `seeds`: integers (or the digit strings of `--seeds`). Each defaults to
    `config.compare.methods` / `config.compare.seeds`; errors name `--methods` / `--seeds`.
    Given `seeds`, the RL stage runs the control arms (null, A/A) only at those of their
    seeds that are in `seeds`, and given `methods`, only when the baseline is among them,
    so processes with disjoint `--seeds` or `--methods` never share a run.
    """
    plan = resolve(cfg, stage, methods, seeds)
    if stage == "preregister":  # before any RL run; commit the file it writes
        record = write_preregistration(cfg)
        logging.info("pre-registration of %s: %s (commit it before any RL run)",
                     cfg.get("name"), record["path"])
        return record
    if stage == "amend":  # more control seeds; commit the file before the runs it adds
        record = write_amendment(cfg)
        logging.info("amended pre-registration of %s: %s (commit it before the runs it adds)",
                     cfg.get("name"), record["path"])
        return record
    if stage == "export":  # a result: its pre-registration matches and is committed
        require_committed(cfg)
    workdir = common.prepare_workdir(workdir)
    if stage in ("rl", "all", "compare") and not plan.exploratory:
        check_preregistration(cfg, "comparison")  # the committed file, before any work
    if stage in NEEDS_START and not os.path.exists(os.path.join(workdir, "sft", "eval.json")):
        raise common.StudyError(f"--stage={stage} needs the start stage's output in "
                                f"{os.path.join(workdir, 'sft')}: run --stage=sft first")
    if plan.exploratory:
        logging.warning("%s: %s", cfg.get("name"), EXPLORATORY)
    trainer_lib.initialize_distributed(cfg.rl)
    logging.info("JAX process %d of %d, %d devices", jax.process_index(), jax.process_count(),
                 jax.device_count())
    t0 = time.perf_counter()
    mesh = make_mesh(cfg)
    table = None
    if stage in ("sft", "all", "regime"):
        stage_sft(cfg, workdir, mesh)
    if stage in RL_STAGES:
        # The validity gate: no RL comparison on a start a blind guesser matches.
        require_readable(cfg, os.path.join(workdir, "sft"), f"--stage={stage}")
    if stage in ("rl", "all", "compare"):
        preregister(cfg, workdir)  # the primary endpoint / exploratory, fixed before any run
        run_plan(cfg, workdir, plan.runs, mesh, resolved=plan.resolved)
    if stage in ("eval", "all", "compare"):
        table = aggregate(cfg, workdir, plan.methods, plan.seeds, mesh=mesh)
        logging.info("\n%s", comparison_markdown(table))
    if stage == "regime":
        table = stage_regime(cfg, workdir, mesh)
        logging.info("\n%s", regime_markdown(table))
    if stage == "frontier":  # --seeds: this process's share of every lr's runs
        table = stage_frontier(cfg, workdir, mesh, plan.seeds if plan.only_seeds else None)
        logging.info("\n%s", frontier_markdown(table))
    if stage in RULES:  # matched, norm_matched; --seeds: this process's share of the runs
        table = stage_matched(cfg, workdir, mesh, plan.seeds if plan.only_seeds else None,
                              RULES[stage])
        logging.info("\n%s", matched_markdown(table))
    if stage == "export":
        table = export_results(cfg, workdir, plan.methods, plan.seeds)
        logging.info("exported %s", table["dir"])
    log_timing(workdir, f"stage_{stage}", time.perf_counter() - t0)
    return table


__all__ = ["STAGES", "run"]
