r"""Math where RL's gain is correctness, not format (issue 49): SmolLM2-135M-Instruct on
two-step arithmetic with a format-ready start, uniform MaxRL vs SERA x 8 paired seeds, the
shuffled-reward null x 4, the A/A control x 4, a sealed test split for the primary endpoint,
each sample's outcome class kept -- the paired protocol (`sera_jax.studies.paired`, its
pretrained-LM kind `lm`).

Why these numbers (`docs/results_math.md`, "Pilot of the two-step task"; the pilot is
`experiments/math_pilot.py`, candidates `steps2_*` / `small2_*`, 64 held-out problems x 16
samples at T 1, 7-8 Dec 2026):

* Problems: `small_chain_addsub`, `small_chain_subadd`, `small_mul_add`, `small_mul_sub`
  ("What is 21 - 16 + 9?", "What is 3 x 6 - 13?": operands up to 25, times tables to 9 x 9);
  64 training, 128 held-out and 128 sealed-test problems, disjoint in content (the
  content-hash bands of `mathqa.problems`). 64 training problems make one epoch 8 steps, so
  SERA allocates from each problem's success history from step 9 on (with 256 it would
  see each problem once in 32 steps and allocate from no history).
* The format-ready start: four worked examples as earlier chat turns (`task.fewshot =
  "steps_short"`: "What is 7 x 6 + 15?" -> "7 x 6 = 42, 42 + 15 = 57"; their contents are
  never drawn), the instruction "Show the steps on one line.", a newline stop, cap 32 (cap 24
  cut 9 % of the lines). The same problems asked for "the number only" without examples
  score pass@1 0.2 % with 47 % truncated (`steps2_number`): without the examples the start
  is not format-ready, and RL's gain would be format.
* RL: P 8 x N0 8 = 64 rollouts a step (one epoch = 8 steps), lr 1e-5 (the arithmetic
  default's), 40 steps, n_max 32 for SERA; evaluated at steps 0, 20, 40 on the 128
  sealed-test problems (the primary), the first 32 held-out problems (reported beside it)
  and 16 training problems (the true p behind realised κ) x 8 samples at T 1, with each
  sample's class (correct / wrong / no answer / truncated) and length kept
  (`eval.outcomes`); KL(π_t ‖ π_start) on 16 held-out problems x 8. The start is also
  scored greedily and at T 0.7 (`eval.start_temperatures`): is a gain learning, or what a
  sharper sampler gets?
* The blind control is the strongest of four answer-blind guessers (`compare.blind =
  "strongest"`: training-answer frequency, per-template frequency, uniform over the
  template's answer range, the template's most frequent answer), all reported.

Analysis, fixed before the runs (`compare.primary`, committed in
results/math/math_smollm2_steps/preregistration.json before any RL run): SERA − uniform on
sealed-test pass@8, averaged over steps 20 and 40, seed-level 95 % t interval over the 8
paired seeds; equivalence margin +-3 points (`compare.margin`), verdict better / worse /
equivalent / inconclusive with its minimal detectable effect at 80 % power. The gate:
uniform − null on held-out pass@1 over the same window, CI above 0 and above 2 x the
evaluation noise floor, on the 4 registered null seeds (no seed is added after a look: a
later addition is reported as a labelled extension, the registered seeds first).

Cost (measured 8 Dec 2026 on the shared machine, one process a core): a sample costs
0.2-0.25 s of one core (the pilot: 1024 samples in 205 s), an RL step 30-50 s with another
process on the same core (about 20 s alone, estimated); one evaluation point is 176
problems x 8 samples, about 6 min. A run is about 13 min of RL + 2 points, about 25 min,
and the 24 runs (8 + 8 + 4 null + 4 A/A) about 5 h on 2 idle cores, above the 3 h the
issue asked for: fewer steps, problems or samples would cut the primary's power or leave
SERA less history to allocate from.

One command on 2 cores (one RL process per core; each run resumes where it stopped):

    W=workdir/math_steps
    M="python -m experiments.math_rl --config=configs/math/smollm2_steps.py --workdir=$W"
    $M --stage=sft && (taskset -c 0 $M --stage=rl --seeds=0,2,4,6 & \
        taskset -c 1 $M --stage=rl --seeds=1,3,5,7 & wait) && $M --stage=eval && \
        $M --stage=export

(`--stage=sft` scores the pretrained start at every evaluation point; there is no SFT.)
"""

import ml_collections

from sera_jax import config_files

arith = config_files.sibling(__file__, "smollm2_arith.py")

_SMALL2 = "small_chain_addsub,small_chain_subadd,small_mul_add,small_mul_sub"


def get_config() -> ml_collections.ConfigDict:
    c = arith.get_config()
    c.name = "math_smollm2_steps"

    c.task.templates = _SMALL2
    c.task.steps = (2,)
    c.task.template = "steps"  # "Show the steps on one line."
    c.task.fewshot = "steps_short"
    c.task.max_new_tokens = 32
    c.task.stop_at_newline = True
    c.task.num_train = 64
    c.task.num_eval = 128
    c.task.num_test = 128  # the sealed test split (content-hash band [0.25, 0.5))
    c.task.sealed_fraction = 0.25

    c.rl.num_steps = 40

    c.compare.seeds = (0, 1, 2, 3, 4, 5, 6, 7)
    c.compare.null_seeds = (0, 1, 2, 3)
    c.compare.amendment = ""  # the arithmetic default's amendment is not this config's
    c.compare.aa_seeds = (0, 1, 2, 3)
    c.compare.primary = ml_collections.ConfigDict(dict(method="sera", split="test", k=8,
                                                       window=2))
    c.compare.margin = 0.03
    c.compare.blind = "strongest"

    c.frontier.seeds = (0, 1, 2, 3)
    c.frontier.null_seeds = (0, 1)

    c.eval.num_samples = 8  # pass@k for k = 1, 2, 4, 8
    c.eval.curve_samples = 8
    c.eval.every = 20  # points 0, 20, 40
    c.eval.num_prompts = 32  # held-out, reported beside the primary
    c.eval.train_prompts = 16  # training problems 0..15: the true p behind realised κ
    c.eval.test_prompts = 128  # the sealed split: the primary endpoint's problems
    c.eval.kl_prompts = 16
    c.eval.outcomes = True
    c.eval.start_temperatures = (0.0, 0.7)
    return c
