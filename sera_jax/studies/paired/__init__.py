r"""The pre-registered paired comparison of RL methods, for any task kind (SERA_SPEC §7).

The protocol knows no task: what differs between tasks -- building the task and the start
policy, the start stage (SFT from scratch, or a pretrained model), the blind control and the
reports' nouns -- is a *kind* (`kinds`: `maze`, `math`; adding one is one module). A config
names its kind in `config.kind`.

Stages (each resumes or skips finished work, so re-running a killed command continues it):

* `sft`: the start stage: the kind's `train_start` (SFT on the one loop for the maze, nothing
  for a pretrained LM), then the start scored at *every* evaluation point with that point's
  keys (common random numbers: the start's row of a comparison is never scored with other keys
  than the RL rows), plus once with a second, independent key set (`eval.noise_seed`): the
  noise floor; and the blind control beside it (`validity`). Each scoring is cached under its
  fingerprint (`sft/crn/`).
* `rl`: for each method (a name of `sera_jax.methods.METHODS`) and seed, RL from the start
  on the one loop (`sera_jax.loop`); the null control `null` = uniform with the rewards of
  every batch permuted within the batch (`compare.null`), the A/A control `aa` = the
  baseline again with RL seed `seed + compare.aa_seed_offset` (`compare.aa`). Every method
  generates exactly `P·N0` rollouts per step; at every evaluation point the policy is scored
  on held-out and training prompts with that point's keys (`spec.eval_key`); every step's
  allocation goes to `alloc.jsonl`.
* `eval`: `results/comparison.{md,json}` and figures (`report`, `tables`, `figures`,
  `curves`): pass@k per arm and seed, paired differences with CIs (`sera_jax.studies.compare`),
  noise floors, the null and A/A controls, believed vs realised κ, and with
  `compare.primary` the curve analysis: Δ(t) bands, the primary endpoint, Holm-adjusted
  secondaries, the gate (RL beats the null by a clear margin); `results/mechanism.{md,json}`
  (`mechanism`): update norms, clip rates, distance and KL from the start per arm.
* `all` = sft + rl + eval; `compare` = rl + eval; `regime` = the regime map (`regime`).
* `preregister` / `amend`: the committed pre-registration (`prereg`) at
  `results/<kind>/<config.name>/preregistration.json`; `frontier`, `matched`,
  `norm_matched` (`frontier`, `matched`): learning-rate frontiers, the lr-matched arm
  (uniform at the lr matching SERA's pass@1 gain) and the norm-matched arm (SERA at the lr
  matching uniform's update norm); `export`: the raw results under
  `results/<kind>/<config.name>/` (`export`; `recompute` rebuilds every number).

Every RL stage refuses to start without a committed pre-registration whose hashed sections
equal the config's -- unless `compare.exploratory=True`: the run is then an exploration, every
table, figure and log says "exploratory (not pre-registered)", and `export` refuses it. Every
RL stage also refuses a start a blind guesser matches (`validity`) unless
`compare.allow_blind_task`.

The config is checked once, at entry (`config.resolve` -> `Plan`); the pure specs
(`spec`: arms, runs, keys, the comparison / primary / frontier / matched specs that the
pre-registration hashes) sit below everything that reads files.

Workdir layout: `sft/` (the start: checkpoints, train.jsonl, eval.json, crn/, validity.json),
`rl/<arm>/seed<s>/` (checkpoints, train.jsonl, eval.jsonl, alloc.jsonl, config.json),
`results/`, `frontier/lr<lr>/`, `matched/lr<lr>/`, `norm_matched/lr<lr>/`, `regime/<cell>/`,
`timings.jsonl`.
A run's fingerprint is the task, model, start, resolved RL and evaluation config plus the
start checkpoint; resuming under a change to any of them is refused, except the fields in
`RESUMABLE` (how long, how often).
"""

from sera_jax.studies.paired.accelerator import smoke
from sera_jax.studies.paired.config import (
    Plan,
    resolve,
    validate,
    validate_compare,
    validate_regime,
)
from sera_jax.studies.paired.curves import (
    PREREGISTERED,
    curve_statistics,
    null_gate,
    per_step_diagnostics,
    preregister,
)
from sera_jax.studies.paired.evaluation import (
    evaluate_policy,
    pass1_distribution,
    sft_points,
)
from sera_jax.studies.paired.figures import plot_comparison, plot_delta_curves, plot_regime
from sera_jax.studies.paired.kinds import KINDS, Kind, get_kind
from sera_jax.studies.paired.regime import (
    cell_name,
    regime_markdown,
    regime_output,
    stage_regime,
    write_regime,
)
from sera_jax.studies.paired.report import (
    aggregate,
    allocation_diagnostics,
    build_table,
    comparison_markdown,
    gather,
)
from sera_jax.studies.paired.spec import (
    AA,
    ALLOC_RECORDS,
    CONTROLS,
    EVAL_DEFAULTS,
    EXPLORATORY,
    NULL,
    RESUMABLE,
    SPLIT_FOLD,
    STAGES,
    arm_config,
    arms,
    build_model,
    build_task,
    cell_config,
    default_threshold,
    eval_key,
    eval_sampling,
    eval_steps,
    is_exploratory,
    make_mesh,
    regime_cells,
    regime_methods,
    regime_seeds,
    regime_thresholds,
    rl_fingerprint,
    rl_plan,
    run_config,
    run_dir,
    start_fingerprint,
    uses_threshold,
)
from sera_jax.studies.paired.stages import RecordingProgram, alloc_record, stage_rl, stage_sft
from sera_jax.studies.paired.study import run

__all__ = [
    "AA", "aggregate", "alloc_record", "ALLOC_RECORDS", "allocation_diagnostics", "arm_config",
    "arms", "build_model", "build_table", "build_task", "cell_config", "cell_name",
    "comparison_markdown", "CONTROLS", "curve_statistics", "default_threshold", "EVAL_DEFAULTS",
    "eval_key", "eval_sampling", "eval_steps", "evaluate_policy", "EXPLORATORY", "gather",
    "get_kind", "is_exploratory", "Kind", "KINDS", "make_mesh", "NULL", "null_gate",
    "pass1_distribution", "per_step_diagnostics", "Plan", "plot_comparison",
    "plot_delta_curves", "plot_regime", "preregister", "PREREGISTERED", "RecordingProgram",
    "regime_cells", "regime_markdown", "regime_methods", "regime_output", "regime_seeds",
    "regime_thresholds", "resolve", "RESUMABLE", "rl_fingerprint", "rl_plan", "run",
    "run_config", "run_dir", "sft_points", "smoke", "SPLIT_FOLD", "stage_regime", "stage_rl",
    "stage_sft", "STAGES", "start_fingerprint", "uses_threshold", "validate",
    "validate_compare", "validate_regime", "write_regime",
]
