"""The CPU example: a tiny random-weight Llama-3 on the embedded arithmetic problems, trained
by `SeraLearner` through tunix's own JAX ("vanilla") rollout engine.

Nothing here is needed to use SERA in tunix: it builds what a real run gets elsewhere (a
model, a tokenizer, a dataset with stable prompt ids, a reward). The tokenizer keeps digits
and spaces and maps every other character to "?", so a random model writes numbers often
enough to be right sometimes (rewards near 0, but not all 0: the allocation has something
to react to). `run(config, workdir)` is what experiments/tunix_sera.py calls.

Resume: each method's tunix checkpoints (`<workdir>/<method>/checkpoints/`) carry the run's
fingerprint (the whole config, `FINGERPRINT_KEY`) and every step's records so far
(`SeraLearner` saves them with the history). A re-run resumes from the latest checkpoint
only when its fingerprint equals the config's (`loop.check_fingerprint`, as the other
binaries do: another config, or checkpoints without a fingerprint, are refused naming the
changed fields), rebuilds the records of the steps before it from the checkpoint, never
trains past `rl.num_steps` (a finished run is not stepped again), and writes `records.json`
with every step.
"""

from __future__ import annotations

import gc
import json
import os
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
import ml_collections
import numpy as np
import optax
from absl import logging
from flax import nnx
from tunix.models.llama3 import model as llama3
from tunix.rl import rl_cluster as rl_cluster_lib
from tunix.rl.grpo import grpo_learner
from tunix.rl.rollout import base_rollout

from sera_jax import loop, optim
from sera_jax import methods as methods_lib
from sera_jax.checkpoint import CheckpointError
from sera_jax.integrations.tunix import real_model
from sera_jax.integrations.tunix.learner import SeraLearner, SeraOptions
from sera_jax.tasks.mathqa import grader, problems
from sera_jax.validation import check, is_int, is_positive_int


class DigitTokenizer:
    """Characters -> ids: 0 pad, 1 bos, 2 eos, then " 0123456789?"; any other character is
    "?". The interface tunix's `TokenizerAdapter` accepts (encode/decode/*_id)."""

    SYMBOLS = " 0123456789?"

    def __init__(self):
        self._ids = {ch: i + 3 for i, ch in enumerate(self.SYMBOLS)}

    @property
    def vocab_size(self) -> int:
        return len(self.SYMBOLS) + 3

    def encode(self, text: str, **_: Any) -> list[int]:
        return [self._ids.get(ch, self._ids["?"]) for ch in text]

    def decode(self, ids: Sequence[int], **_: Any) -> str:
        return "".join(self.SYMBOLS[int(i) - 3] for i in ids if int(i) >= 3)

    def bos_id(self) -> int:
        return 1

    def eos_id(self) -> int:
        return 2

    def pad_id(self) -> int:
        return 0


def tiny_model(vocab_size: int, seed: int, *, layers: int = 2, dim: int = 32) -> Any:
    """A random-weight tunix Llama-3 (2 layers, width 32 by default)."""
    config = llama3.ModelConfig(num_layers=layers, vocab_size=vocab_size, embed_dim=dim,
                                hidden_dim=2 * dim, num_heads=2, head_dim=dim // 2,
                                num_kv_heads=1, rope_theta=10_000, norm_eps=1e-5)
    return llama3.Llama3(config, rngs=nnx.Rngs(seed))


def cpu_mesh() -> jax.sharding.Mesh:
    """One device, the (fsdp, tp) axes tunix's models shard over."""
    return jax.sharding.Mesh(np.array(jax.devices()[:1]).reshape(1, 1), ("fsdp", "tp"))


def make_cluster(model: Any, tokenizer: Any, *, optimizer: optax.GradientTransformation,
                 max_steps: int, max_new_tokens: int, max_prompt_length: int = 128,
                 temperature: float = 1.0, checkpoint_dir: str | None = None,
                 eos_tokens: Sequence[int] | None = None) -> rl_cluster_lib.RLCluster:
    """A colocated tunix RL cluster (actor = rollout model, no reference) with the vanilla
    rollout; checkpoints every step under `checkpoint_dir` when given; generation stops at
    any of `eos_tokens` (default: the tokenizer's eos)."""
    import orbax.checkpoint as ocp

    mesh = cpu_mesh()
    training = rl_cluster_lib.RLTrainingConfig(
        actor_optimizer=optimizer, max_steps=max_steps, eval_every_n_steps=10**9,
        checkpoint_root_directory=checkpoint_dir,
        checkpointing_options=ocp.CheckpointManagerOptions(save_interval_steps=1,
                                                           max_to_keep=2))
    rollout = base_rollout.RolloutConfig(
        max_tokens_to_generate=max_new_tokens, max_prompt_length=max_prompt_length,
        kv_cache_size=max_prompt_length + max_new_tokens, temperature=temperature,
        eos_tokens=list(eos_tokens) if eos_tokens else None)
    config = rl_cluster_lib.ClusterConfig(
        role_to_mesh={role: mesh for role in (rl_cluster_lib.Role.ACTOR,
                                              rl_cluster_lib.Role.REFERENCE,
                                              rl_cluster_lib.Role.ROLLOUT)},
        rollout_engine="vanilla", offload_to_cpu=False, training_config=training,
        rollout_config=rollout)
    return rl_cluster_lib.RLCluster(actor=model, tokenizer=tokenizer, cluster_config=config)


def arithmetic_batches(num_prompts: int, prompts_per_step: int, num_steps: int, seed: int,
                       prompt: Callable[[str], str] | None = None,
                       templates: Sequence[str] = ("add", "mul")
                       ) -> list[dict[str, np.ndarray]]:
    """`num_steps` batches cycling through `num_prompts` generated one-step problems of
    `templates` (`sera_jax.tasks.mathqa.problems`), each `{"prompts", "answer",
    "prompt_id"}`; the problem order is reshuffled every epoch from `seed`. prompt_id is the
    problem's index: the history's stable key. `prompt` maps a question to the prompt text
    (default: the question and a space)."""
    data = problems.generate_arithmetic(num_prompts, 0, seed=seed, steps=(1,),
                                        templates=tuple(templates))["train"]
    prompt = prompt or (lambda question: question + " ")
    rng = np.random.default_rng(seed)
    order = np.concatenate([rng.permutation(num_prompts)
                            for _ in range(-(-num_steps * prompts_per_step // num_prompts))])
    out = []
    for step in range(num_steps):
        ids = order[step * prompts_per_step:(step + 1) * prompts_per_step]
        out.append({"prompts": np.array([prompt(data[i].question) for i in ids]),
                    "answer": np.array([data[i].answer for i in ids]),
                    "prompt_id": ids.astype(np.int32)})
    return out


def math_reward(prompts: Sequence[str], completions: Sequence[str], answer: Sequence[str],
                **_: Any) -> list[float]:
    """1.0 iff the completion's answer equals the gold one (`sera_jax.tasks.mathqa.grader`)."""
    del prompts
    return [grader.grade(c, str(a), timeout_s=1) for c, a in zip(completions, answer)]


def templates_of(c: ml_collections.ConfigDict) -> tuple[str, ...]:
    """`c.task.templates` (comma-separated names of `problems.TEMPLATE_NAMES`; default
    "add,mul") as a tuple."""
    return tuple(t.strip() for t in str(c.task.get("templates", "add,mul")).split(",")
                 if t.strip())


def validate_config(c: ml_collections.ConfigDict) -> None:
    """ValueError naming the first bad field (before any model is built)."""
    rl = c.rl
    names = templates_of(c)
    check(bool(names) and set(names) <= set(problems.TEMPLATE_NAMES), "task.templates",
          c.task.get("templates"), f"comma-separated names of {problems.TEMPLATE_NAMES}")
    for field in ("num_steps", "prompts_per_step", "rollouts_per_prompt"):
        check(is_positive_int(rl[field]), f"rl.{field}", rl[field], "an integer >= 1")
    check(rl.rollouts_per_prompt >= 2, "rl.rollouts_per_prompt", rl.rollouts_per_prompt,
          "an integer >= 2 (tunix's num_generations)")
    check(is_int(c.task.num_prompts) and c.task.num_prompts >= rl.prompts_per_step,
          "task.num_prompts", c.task.num_prompts, "an integer >= rl.prompts_per_step")
    names = tuple(c.compare.methods) or (rl.method,)
    for name in names:
        check(name in methods_lib.METHODS, "compare.methods", name,
              f"names of sera_jax.methods.METHODS {sorted(methods_lib.METHODS)}")


def build_policy(c: ml_collections.ConfigDict
                 ) -> tuple[Any, Any, Callable[[str], str] | None, list[int] | None]:
    """(tunix model, tokenizer, question -> prompt text, stop ids) of `c.model.source`:
    "random" (`tiny_model` + `DigitTokenizer`) or "smollm2" (the embedded
    SmolLM2-135M-Instruct in tunix's Llama-3, its chat template and
    `c.task.instruction`; `sera_jax.integrations.tunix.real_model`)."""
    source = c.model.get("source", "random")
    if source == "smollm2":
        model, tokenizer, _ = real_model.smollm2_policy(c.seed)
        return (model, tokenizer, real_model.chat_formatter(tokenizer, c.task.instruction),
                tokenizer.stop_ids())
    check(source == "random", "model.source", source, "'random' or 'smollm2'")
    tokenizer = DigitTokenizer()
    return (tiny_model(tokenizer.vocab_size, c.seed, layers=c.model.layers, dim=c.model.dim),
            tokenizer, None, None)


#: Key of the run's fingerprint in the custom metadata of the example's tunix checkpoints.
FINGERPRINT_KEY = "sera_example_fingerprint"


def fingerprint(c: ml_collections.ConfigDict, name: str) -> dict[str, Any]:
    """What a method's run is: the whole config and the method (nothing may change on
    resume: the optimizer's schedule and the data order depend on `rl.num_steps` too)."""
    return loop.canonical({"config": c.to_dict(), "method": name})


def check_resume(trainer: Any, fp: dict[str, Any], directory: str, num_steps: int) -> int:
    """The step a method resumes at (0: a fresh run): refuses (CheckpointError naming the
    changed fields) checkpoints of another config or without a fingerprint, and a
    checkpoint beyond `num_steps`."""
    restored = int(trainer.train_steps)
    if not restored:
        return 0
    meta = trainer._restored_custom_metadata or {}
    loop.check_fingerprint(meta.get(FINGERPRINT_KEY), fp, (), directory)
    if restored > num_steps:
        raise CheckpointError(
            f"refusing to resume {directory} at step {restored}: beyond rl.num_steps="
            f"{num_steps}; move the directory away or use a new workdir")
    return restored


def _save_fingerprint_with(manager: Any, fp: dict[str, Any]) -> None:
    """Every checkpoint the manager writes also carries `fp` in its custom metadata."""
    save = manager.save

    def save_with_fingerprint(step, model, optimizer=None, save_only_lora_params=False,
                              force=False, custom_metadata=None):
        meta = {**dict(custom_metadata or {}), FINGERPRINT_KEY: fp}
        return save(step, model, optimizer, save_only_lora_params=save_only_lora_params,
                    force=force, custom_metadata=meta)

    manager.save = save_with_fingerprint


def run_method(c: ml_collections.ConfigDict, name: str, workdir: str | None
               ) -> SeraLearner:
    """Train one method from the same seed; returns the learner (its `records`: every step
    of the run, the ones before a resume restored from the checkpoint). With a workdir it
    resumes from `<workdir>/<name>/checkpoints` (module docstring)."""
    overrides = {"threshold": c.rl.allocation.threshold} if c.rl.allocation.threshold else {}
    method = methods_lib.resolve(name, overrides)
    model, tokenizer, prompt, eos = build_policy(c)
    checkpoints = os.path.join(workdir, name, "checkpoints") if workdir else None
    cluster = make_cluster(
        model, tokenizer,
        optimizer=optim.make_optimizer(c.rl.optimizer, num_steps=c.rl.num_steps),
        max_steps=c.rl.num_steps, max_new_tokens=c.rl.max_new_tokens,
        max_prompt_length=c.rl.get("max_prompt_length", 128), temperature=c.rl.temperature,
        checkpoint_dir=checkpoints, eos_tokens=eos)
    fp = fingerprint(c, name)
    trainer = cluster.actor_trainer
    restored = check_resume(trainer, fp, checkpoints, c.rl.num_steps) if checkpoints else 0
    algo = grpo_learner.GRPOConfig(
        num_generations=c.rl.rollouts_per_prompt, num_iterations=1, beta=0.0,
        advantage_estimator=method.estimator,
        loss_agg_mode=c.rl.get("loss_agg_mode", "sequence-mean-token-mean"))
    a, h = c.rl.allocation, c.rl.history
    sera = SeraOptions(num_prompts=c.task.num_prompts, method=method, n_min=a.n_min,
                       n_max=a.n_max, unseen=a.unseen, alpha=h.alpha, beta=h.beta,
                       gamma=h.gamma, max_rounds=c.rl.max_rounds)
    learner = SeraLearner(cluster, algo, math_reward, sera)
    if checkpoints and trainer.checkpoint_manager is not None:
        _save_fingerprint_with(trainer.checkpoint_manager, fp)
    if restored:
        print(f"[{name}] resumed at step {restored} of {c.rl.num_steps} from {checkpoints} "
              f"({len(learner.records)} records restored)", flush=True)
    if restored >= c.rl.num_steps:
        return learner  # finished: never a step past rl.num_steps
    log, start = learner._log, time.perf_counter()

    def log_and_print(*args: Any, **kwargs: Any) -> None:  # one progress line per step
        log(*args, **kwargs)
        r = learner.records[-1]
        print(f"[{name}] step {r['step']} ids {r['prompt_ids']} counts {r['counts']} "
              f"reward {r['reward_mean']:.3f} length {r['length_mean']:.1f} "
              f"t {r['time'] - start:.0f}s", flush=True)

    learner._log = log_and_print
    learner.train(arithmetic_batches(c.task.num_prompts, c.rl.prompts_per_step,
                                     c.rl.num_steps * c.rl.max_rounds, c.seed, prompt,
                                     templates_of(c)))
    return learner


def format_records(name: str, records: Sequence[dict[str, Any]]) -> str:
    """One line per step: the batch's prompt ids, p̂, counts N_q (of the first round under
    dynamic sampling), mean reward, rollouts generated, groups that reached the loss."""
    lines = [f"## {name}", "step | prompt ids | p_hat | counts N_q | mean reward | mean length "
             "| generated rollouts | kept groups | seconds since the previous step"]
    for i, r in enumerate(records):
        p_hat = " ".join("-" if p is None or np.isnan(p) else f"{p:.2f}" for p in r["p_hat"])
        clock = "wall_time" if "wall_time" in r else "time"  # a resume: the wall clock
        dt = (f"{r[clock] - records[i - 1][clock]:.1f}"
              if i and clock in records[i - 1] else "-")
        lines.append(f"{r['step']} | {r['prompt_ids']} | {p_hat} | {r['counts']} | "
                     f"{r['reward_mean']:.3f} | {r['length_mean']:.1f} | "
                     f"{r['dapo/generated_rollouts']} | "
                     f"{r.get('dapo/kept_groups', len(r['counts']))} | {dt}")
    return "\n".join(lines)


def run(c: ml_collections.ConfigDict, workdir: str | None) -> dict[str, Any]:
    """Every method of `compare.methods` (or `rl.method`) from the same seed; the summary
    lists each step's allocation and rewards. With a workdir each finished method's records
    go to `<workdir>/<method>/records.json` with the config that made them, and a re-run
    skips that method (a changed config is refused: use another workdir)."""
    validate_config(c)
    logging.set_verbosity(logging.WARNING)  # tunix logs every prompt and completion at INFO
    config = loop.canonical(c.to_dict())
    out = {}
    for name in tuple(c.compare.methods) or (c.rl.method,):
        done = os.path.join(workdir, name, "records.json") if workdir else None
        if done and os.path.exists(done):
            with open(done) as f:
                saved = json.load(f)
            if saved["config"] != config:
                changed = ", ".join(loop.changed_fields(saved["config"], config)[:8])
                raise ValueError(f"{done} was made with another config ({changed}); run the "
                                 "changed config in a new workdir")
            out[name] = saved["records"]
            print(f"[{name}] finished earlier: {done}", flush=True)
        else:
            # The learner (model, optimiser state, compiled steps) is dropped before the next
            # method starts: two SmolLM2 learners at once ran out of a 24 GB machine's memory.
            out[name] = run_method(c, name, workdir).records
            gc.collect()
            if done:
                os.makedirs(os.path.dirname(done), exist_ok=True)
                with open(done, "w") as f:
                    json.dump({"config": config, "records": out[name]}, f, indent=1)
        print(format_records(name, out[name]), flush=True)
    summary = "\n\n".join(format_records(n, r) for n, r in out.items())
    if workdir:
        os.makedirs(workdir, exist_ok=True)
        with open(os.path.join(workdir, "summary.md"), "w") as f:
            f.write(summary + "\n")
        with open(os.path.join(workdir, "records.json"), "w") as f:
            json.dump(out, f, indent=1)
    return {"records": out, "summary": summary}
