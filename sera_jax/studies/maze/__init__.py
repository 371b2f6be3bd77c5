r"""The maze study: SFT from scratch, then RL of each method x seed at matched rollout
budgets, a null control, and a paired comparison with confidence intervals (SERA_SPEC §7).

Stages (each resumes or skips finished work, so re-running a killed command continues it):

* `sft`: supervised next-token training on BFS shortest paths (`sera_jax.sft` on the one
  loop), then the SFT policy scored at *every* evaluation point with that point's keys
  (common random numbers: the SFT row of a comparison is never scored with other keys than
  the RL rows), plus once with a second, independent key set (`eval.noise_seed`): the
  noise floor. Each scoring is cached under its fingerprint (`sft/crn/`).
* `rl`: for each method (a name of `sera_jax.methods.METHODS`) and seed, RL from the SFT
  checkpoint on the one loop (`sera_jax.loop`); and, when `compare.null`, the null control
  `null` = uniform with the rewards of every batch permuted within the batch
  (`rl.shuffle_rewards`, same lr and budget); when `compare.aa`, the A/A control `aa` = the
  baseline again with RL seed `seed + compare.aa_seed_offset` (nothing else differs).
  With `compare.primary` set, the primary endpoint is written to `preregistered.json`
  before the first RL run. Every method generates exactly `P·N0`
  rollouts per step. At every evaluation point (every `eval.every` steps and the end) the
  policy is scored on the held-out mazes and on the training mazes with the keys of that
  point (`eval_key`); every step's allocation goes to `alloc.jsonl`.
* `eval`: aggregation -> `results/comparison.{md,json}` and figures: pass@k per method and
  seed, paired differences method − `compare.baseline` with bootstrap CIs
  (`sera_jax.studies.compare`), each arm − SFT, the noise floor and the null-control
  check, and the allocator's diagnostics: believed κ (from p̂), realised κ (from the
  training-maze success rates the evaluation measured), mixed-group fraction, share of the
  budget on never-solved mazes, generated rollouts and tokens. With `compare.primary` (the
  long-horizon default) also the curve analysis (`curves`): Δ(t) with seed-level bands at
  every point, the primary endpoint, Holm-adjusted secondaries, the null gate (RL beats the
  null by a clear margin), the A/A false-positive rate, per-step diagnostics and the
  published with-replacement bootstrap pass@k beside the unbiased one.
* `all` = sft + rl + eval; `compare` = rl + eval; `regime` = the regime map (a sweep of
  prompts per step x N0 with n_max tied to N0, `config.regime`), sharing the SFT stage.
* `preregister`: write `results/maze/<config.name>/preregistration.json` (`prereg`: primary
  endpoint + config hash; the frontier's metric, window, lr grid and rules), to be committed
  before any RL run; rl / compare / all / frontier / matched refuse to start without it or
  when it differs from the config, and the aggregator refuses a changed primary.
  `amend`: record in that file, dated and with `compare.amendment`'s reason, more seeds of
  the control arms (null, A/A) and nothing else, before the runs it adds.
* `frontier`: the lr frontier (`frontier`), the SFT start as uniform's lr -> 0 point;
  `matched`: the lr-matched uniform arm (`matched`: lr chosen by a written rule from the
  frontier, pre-registered, run, compared with SERA); `export`: the raw results under
  `results/maze/<config.name>/` (`export`; `recompute` rebuilds every number from them).

Task validity (issue 37, `validity`): the SFT stage also writes `sft/validity.json`, the
maze-blind control (`blind`: exact pass@k of a policy that emits SFT answers at their SFT
frequency) beside the start; every RL stage refuses a start that does not clearly read the
maze unless `compare.allow_blind_task` (recorded in the outputs); every table, figure and
verdict carries the blind row.

Workdir layout: `sft/` (checkpoints, train.jsonl, eval.json, crn/, config.json),
`rl/<method>/seed<s>/` (checkpoints, tensorboard, train.jsonl, eval.jsonl, alloc.jsonl,
config.json), `results/`, `regime/<cell>/` (the regime map's cells), `timings.jsonl`.

A run's fingerprint is the task, model, SFT, resolved RL and evaluation config plus the SFT
checkpoint it starts from; resuming under a change to any of them is refused, except the
fields in `RESUMABLE` (how long, how often).

Modules, by stage: `setup` (constants, task / model / mesh, per-run configs, fingerprints,
validation), `evaluation` (scoring a policy at an evaluation point), `stages` (SFT, one RL
run), `report` (comparison.json / .md, allocator diagnostics), `curves` (the statistics of a
training curve), `figures` (PNGs), `regime`
(the regime map and θ sweep), `accelerator` (`smoke`, the accelerator smoke test) and
`study` (`run`, what `experiments/maze.py` calls); issue 37's `blind`, `validity`, `prereg`,
`matched`, `tables` (the markdown), `export` and `recompute`.
"""

from sera_jax.studies.maze.accelerator import smoke
from sera_jax.studies.maze.curves import (
    PREREGISTERED,
    curve_statistics,
    null_gate,
    per_step_diagnostics,
    preregister,
)
from sera_jax.studies.maze.evaluation import (
    _eval_fingerprint,  # noqa: F401 (tests/test_precision.py)
    evaluate_policy,
    latest_sft_step,
    pass1_distribution,
    sft_points,
)
from sera_jax.studies.maze.figures import plot_comparison, plot_delta_curves, plot_regime
from sera_jax.studies.maze.regime import (
    arm_config,
    cell_config,
    cell_name,
    default_threshold,
    regime_cells,
    regime_markdown,
    regime_methods,
    regime_output,
    regime_seeds,
    regime_thresholds,
    stage_regime,
    uses_threshold,
    validate_regime,
    write_regime,
)
from sera_jax.studies.maze.report import (
    aggregate,
    allocation_diagnostics,
    build_table,
    comparison_markdown,
    gather,
)
from sera_jax.studies.maze.setup import (
    AA,
    ALLOC_RECORDS,
    CONTROLS,
    EVAL_DEFAULTS,
    MODEL_DEFAULTS,
    NULL,
    RESUMABLE,
    SPLIT_FOLD,
    STAGES,
    arms,
    build_model,
    build_task,
    eval_key,
    eval_sampling,
    eval_steps,
    make_mesh,
    rl_fingerprint,
    rl_plan,
    run_config,
    run_dir,
    sft_fingerprint,
    sft_width,
    validate,
    validate_compare,
)
from sera_jax.studies.maze.stages import RecordingProgram, alloc_record, stage_rl, stage_sft
from sera_jax.studies.maze.study import run

__all__ = [
    "AA", "ALLOC_RECORDS", "CONTROLS", "PREREGISTERED", "curve_statistics", "null_gate",
    "per_step_diagnostics", "plot_delta_curves", "preregister", "rl_plan", "EVAL_DEFAULTS",
    "MODEL_DEFAULTS", "NULL", "RESUMABLE", "SPLIT_FOLD",
    "STAGES", "RecordingProgram", "aggregate", "alloc_record", "allocation_diagnostics",
    "arm_config", "arms", "build_model", "build_task", "cell_config", "cell_name",
    "comparison_markdown", "default_threshold", "eval_key", "eval_sampling", "eval_steps",
    "evaluate_policy", "latest_sft_step", "make_mesh",
    "pass1_distribution", "plot_comparison", "plot_regime", "regime_cells", "regime_markdown",
    "regime_methods", "regime_output", "regime_seeds", "regime_thresholds",
    "rl_fingerprint", "run", "run_config", "run_dir", "sft_fingerprint", "sft_points",
    "sft_width", "smoke", "stage_regime", "stage_rl", "stage_sft", "uses_threshold",
    "validate", "validate_compare", "validate_regime", "write_regime", "build_table", "gather",
]
