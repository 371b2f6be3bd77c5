"""SERA inside tunix: a drop-in GRPO learner with per-prompt rollout counts, and `maxrl`.

Written against google-tunix==0.1.7 (`SUPPORTED_TUNIX_VERSIONS`); importing this module
with another version raises ImportError naming the supported one (set
SERA_JAX_TUNIX_UNCHECKED=1 to try another version at your own risk).

* ``maxrl`` is registered in tunix's advantage-estimator registry on import, so the
  uniform MaxRL baseline is plain tunix with one option changed:
  ``GRPOConfig(advantage_estimator="maxrl", beta=0.0)``. It is
  `sera_jax.estimators.maxrl` on tunix's groups of `num_generations` consecutive rows.
* `SeraLearner` subclasses tunix's `GRPOLearner` (beta = 0, one iteration per batch). tunix
  hands it each batch with every prompt repeated N0 = `num_generations` times (P·N0 = B
  rows); per training batch it
  1. reads p̂ of the batch's prompts from a `sera_jax.history.SuccessHistory`, keyed by the
     stable prompt id in column `SeraOptions.prompt_id_key`;
  2. allocates counts N_q (Σ N_q = B exactly) with the `sera_jax.methods` method;
  3. repeats prompt q N_q times, so the batch keeps its B rows and tunix's shapes, and
     generates through the cluster's rollout engine (vanilla, vLLM or sglang-jax);
  4. computes the method's advantages over segment ids (ragged groups,
     `sera_jax.estimators`) and folds w_q = N0/N_q into them: the per-row coefficient
     w_q·A_r is what tunix's GRPO loss multiplies the (ratio = 1) log-probs with, so the
     loss is SERA's weighted loss for any tunix `loss_agg_mode`;
  5. adds the outcomes to the history (pending until the next epoch, `SeraOptions`).
  With method "uniform" every N_q = N0, w_q = 1 and the batch, advantages, loss and
  gradient are those of `GRPOLearner` with ``advantage_estimator="maxrl"``. Evaluation
  batches go through `GRPOLearner` unchanged (uniform).
* A method with ``dynamic_sampling`` (DAPO, `sera_jax.dynamic_sampling`) draws further
  batches from the training iterator until the informative groups fill the B rows (at most
  `SeraOptions.max_rounds` rounds), counting every generated rollout and token.
* The history (and the data position of refills) is saved in the custom metadata of
  tunix's own checkpoints and restored with them: resuming continues exactly. So are the
  per-step `records` written so far: a resumed learner's `records` are the whole run's.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from sera_jax.integrations.tunix._version import check_tunix_version

TUNIX_VERSION = check_tunix_version()

# Imported after the check, so an unsupported tunix fails with the message above.
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from tunix.generate import utils as tunix_generate_utils  # noqa: E402
from tunix.perf.experimental import constants as perf_constants  # noqa: E402
from tunix.rl import function_registry, rl_cluster  # noqa: E402
from tunix.rl.grpo import grpo_learner  # noqa: E402

from sera_jax import dynamic_sampling as ds_lib  # noqa: E402
from sera_jax import estimators  # noqa: E402
from sera_jax import history as history_lib  # noqa: E402
from sera_jax import methods as methods_lib  # noqa: E402

TRAIN = rl_cluster.Mode.TRAIN
#: Key of SERA's state in the custom metadata of tunix's checkpoints.
CHECKPOINT_KEY = "sera_jax"
_HISTORY_FIELDS = tuple(f.name for f in dataclasses.fields(history_lib.SuccessHistory))


@function_registry.register_advantage_estimator("maxrl")
def maxrl_advantages(rewards: Any, num_generations: int) -> np.ndarray:
    """tunix's estimator signature: rewards [G·n] in G groups of n = `num_generations`
    consecutive rows -> A_i = (r_i − r̄_g)/(r̄_g + ε) (`sera_jax.estimators.maxrl`;
    binary rewards, 0 for an all-zero group)."""
    r = np.asarray(rewards, np.float32)
    if r.ndim != 1 or num_generations < 1 or r.shape[0] % num_generations:
        raise ValueError(f"maxrl: rewards of shape {r.shape} do not split into groups of "
                         f"num_generations={num_generations}")
    groups = r.shape[0] // num_generations
    seg = np.repeat(np.arange(groups, dtype=np.int32), num_generations)
    return np.asarray(estimators.maxrl(r, seg, groups))


@dataclasses.dataclass(frozen=True)
class SeraOptions:
    """SERA's settings for `SeraLearner` (tunix's own stay in `GRPOConfig`).

    num_prompts: M, the dataset size; every batch carries a column `prompt_id_key` of
    stable ids in [0, M) (e.g. the row index). method: a `sera_jax.methods` name or a
    resolved `Method`. n_min / n_max / unseen: allocation bounds and the policy for prompts
    without an estimate. alpha / beta / gamma: the history's Beta prior and per-epoch
    discount; an epoch is M consecutive training prompts (the history folds its pending
    outcomes in when the count of prompts drawn crosses a multiple of M). max_rounds:
    generation rounds per batch for a dynamic-sampling method (1 = filter only).
    """

    num_prompts: int
    method: str | methods_lib.Method = "sera"
    n_min: int = 2
    n_max: int = 16
    unseen: str = "fill"
    alpha: float = 0.5
    beta: float = 0.5
    gamma: float = 0.75
    prompt_id_key: str = "prompt_id"
    max_rounds: int = 4

    def resolved_method(self) -> methods_lib.Method:
        if isinstance(self.method, methods_lib.Method):
            return self.method
        return methods_lib.get_method(self.method)


def validate(algo_config: Any, sera: SeraOptions) -> methods_lib.Method:
    """The resolved method; ValueError naming the setting to change for anything the
    learner does not support (checked before any model work)."""
    if not isinstance(algo_config, grpo_learner.GRPOConfig):
        raise ValueError(f"algo_config must be a tunix GRPOConfig; got {type(algo_config)}")
    problems = []
    if algo_config.beta != 0.0:
        problems.append(f"beta={algo_config.beta} (SeraLearner trains without a KL term: "
                        "beta=0.0)")
    if algo_config.num_iterations != 1:
        problems.append(f"num_iterations={algo_config.num_iterations} (one update per batch: "
                        "num_iterations=1; the weights assume on-policy rollouts)")
    if algo_config.policy_loss_fn != "grpo" or algo_config.loss_algo != "grpo":
        problems.append(f"policy_loss_fn={algo_config.policy_loss_fn!r}, loss_algo="
                        f"{algo_config.loss_algo!r} (use 'grpo' for both)")
    method = sera.resolved_method()
    if algo_config.advantage_estimator != method.estimator:
        problems.append(f"advantage_estimator={algo_config.advantage_estimator!r} (set it "
                        f"to the method's {method.estimator!r}, used for evaluation batches)")
    if method.two_stage:
        problems.append(f"method {method.name!r} needs an in-step pilot, which the learner "
                        "does not draw; use a one-shot method here (sera_jax.rl's Trainer "
                        "runs it)")
    if method.stateful:
        problems.append(f"method {method.name!r} carries allocator state across steps, "
                        "which the learner does not hold; use a stateless method here "
                        "(sera_jax.rl's Trainer runs it)")
    if problems:
        raise ValueError("SeraLearner: unsupported GRPOConfig/SeraOptions: "
                         + "; ".join(problems))
    history_lib.SuccessHistory.create(sera.num_prompts, sera.alpha, sera.beta, sera.gamma)
    if not isinstance(sera.max_rounds, int) or sera.max_rounds < 1:
        raise ValueError(f"SeraOptions.max_rounds={sera.max_rounds!r} must be an int >= 1")
    return method


# ----------------------------------------------------------------------------- batches


def group_columns(batch: Mapping[str, Any], n0: int, id_key: str) -> dict[str, np.ndarray]:
    """The columns of a tunix training batch with each prompt once (its first row).

    tunix repeats every prompt `n0` times in consecutive rows; raises ValueError when the
    prompt-id column is missing or the rows do not form such groups.
    """
    if id_key not in batch:
        raise ValueError(f"training batches need a {id_key!r} column of stable integer prompt "
                         f"ids in [0, num_prompts) (e.g. the dataset row index); columns: "
                         f"{sorted(batch)}")
    ids = np.asarray(batch[id_key])
    if ids.ndim != 1 or ids.shape[0] % n0 or not np.issubdtype(ids.dtype, np.integer):
        raise ValueError(f"{id_key!r} must be 1-D integers with a multiple of num_generations"
                         f"={n0} rows; got {ids.dtype}{list(ids.shape)}")
    if np.any(ids.reshape(-1, n0) != ids[::n0, None]):
        raise ValueError(f"rows are not groups of {n0} repeats of one prompt ({id_key!r} "
                         "changes inside a group)")
    return {k: np.asarray(v)[::n0] for k, v in batch.items() if k != "trajectory_ids"}


def take_rows(columns: Mapping[str, np.ndarray], segment_ids: np.ndarray) -> dict[str, Any]:
    """Row r of the result is row `segment_ids[r]` of every column."""
    return {k: np.asarray(v)[segment_ids] for k, v in columns.items()}


@dataclasses.dataclass
class _Round:
    """One allocated, generated and scored group of prompts (host arrays)."""

    rows: dict[str, Any]  # the batch columns, one row per rollout
    prompt_ids: np.ndarray  # [P] dataset ids
    p_hat: np.ndarray  # [P] (NaN = unseen)
    counts: np.ndarray  # [P]
    segment_ids: np.ndarray  # [R]
    rewards: np.ndarray  # [R]
    coef: np.ndarray  # [R] w_q · A_r
    completions: list[str]
    completion_ids: np.ndarray  # [R, T]
    prompt_tokens: np.ndarray  # [R, W] left-padded


# ----------------------------------------------------------------------------- learner


class SeraLearner(grpo_learner.GRPOLearner):
    """tunix's GRPO learner with SERA's per-prompt rollout counts (see the module doc).

    Constructed like `GRPOLearner` plus `sera`; train with `learner.train(train_ds)`.
    `records` holds one dict per training batch of the run -- restored from the checkpoint
    the learner resumes from, then this process's (prompt ids, p̂, counts, mean reward per
    prompt, mean completion length, generated rollouts/tokens, `time.perf_counter()` and
    the wall clock `wall_time` when the batch was scored); `history` is the live
    `SuccessHistory`.
    """

    def __init__(self, rl_cluster: rl_cluster.RLCluster, algo_config: Any,
                 reward_fns: Any, sera: SeraOptions, metric_fns: Sequence[Any] | None = None,
                 data_shuffle_seed: int | None = None):
        self.method = validate(algo_config, sera)
        self.sera = sera
        super().__init__(rl_cluster=rl_cluster, algo_config=algo_config,
                         reward_fns=reward_fns, metric_fns=metric_fns,
                         data_shuffle_seed=data_shuffle_seed)
        self._lock = threading.Lock()
        self.history = history_lib.SuccessHistory.create(sera.num_prompts, sera.alpha,
                                                         sera.beta, sera.gamma)
        self.prompts_drawn = 0  # training prompts drawn so far
        self.epochs_started = 0  # history.start_epoch calls so far
        self.refill_batches = 0  # iterator items drawn by dynamic-sampling refills
        self.records: list[dict[str, Any]] = []
        self._train_iterator = None
        self._skip_on_resume = 0
        trainer = self.rl_cluster.actor_trainer
        self._restore(trainer._restored_custom_metadata, trainer.train_steps)
        self._save_history_with(trainer.checkpoint_manager)

    # -------------------------------------------------------------- checkpoints

    def checkpoint_state(self) -> dict[str, Any]:
        """JSON-able state saved in tunix checkpoints (float32 round-trips exactly)."""
        with self._lock:
            h = self.history
            return {"history": {f: np.asarray(getattr(h, f)).tolist() for f in _HISTORY_FIELDS},
                    "prompts_drawn": self.prompts_drawn,
                    "epochs_started": self.epochs_started,
                    "refill_batches": self.refill_batches,
                    "method": self.method.to_dict(),
                    "records": list(self.records)}

    def _restore(self, metadata: Mapping[str, Any] | None, restored_steps: int) -> None:
        state = (metadata or {}).get(CHECKPOINT_KEY)
        if state is None:
            if restored_steps:
                raise ValueError(
                    f"the tunix checkpoint restored at step {restored_steps} holds no SERA "
                    "history (written by another learner?); resume from a SeraLearner "
                    "checkpoint or start in an empty checkpoint_root_directory")
            return
        if state["method"] != self.method.to_dict():
            raise ValueError(f"checkpoint was written with method {state['method']}; this run "
                             f"uses {self.method.to_dict()}")
        ref = self.history
        fields = {f: jnp.asarray(np.asarray(state["history"][f], dtype=getattr(ref, f).dtype))
                  for f in _HISTORY_FIELDS}
        if fields["successes"].shape != ref.successes.shape:
            raise ValueError(f"checkpoint history covers {fields['successes'].shape[0]} prompts;"
                             f" SeraOptions.num_prompts={self.sera.num_prompts}")
        self.history = history_lib.SuccessHistory(**fields)
        self.prompts_drawn = int(state["prompts_drawn"])
        self.epochs_started = int(state["epochs_started"])
        self.refill_batches = self._skip_on_resume = int(state["refill_batches"])
        # Checkpoints written before records were saved with them restore none.
        self.records = [dict(r) for r in state.get("records", [])]

    def _save_history_with(self, manager: Any) -> None:
        """Every save of the actor's checkpoint manager (tunix's periodic ones and its final
        forced one) also writes `checkpoint_state()` into the step's custom metadata."""
        save = manager.save

        def save_with_history(step, model, optimizer=None, save_only_lora_params=False,
                              force=False, custom_metadata=None):
            meta = dict(custom_metadata or {})
            meta[CHECKPOINT_KEY] = self.checkpoint_state()
            return save(step, model, optimizer, save_only_lora_params=save_only_lora_params,
                        force=force, custom_metadata=meta)

        manager.save = save_with_history

    # -------------------------------------------------------------- data

    def _prepare_data(self, iterator, *args, **kwargs):
        """tunix's data pipeline; keeps the training iterator for dynamic-sampling refills
        and, after a resume, first skips the items earlier refills consumed."""
        if kwargs.get("mode", TRAIN) == TRAIN:
            self._train_iterator = iterator
            while self._skip_on_resume > 0:
                next(iterator)
                self._skip_on_resume -= 1
        return super()._prepare_data(iterator, *args, **kwargs)

    def _next_refill(self) -> dict[str, np.ndarray] | None:
        """The next training item's columns (one row per prompt), None when exhausted."""
        try:
            item = next(self._train_iterator)
        except (StopIteration, TypeError):
            return None
        with self._lock:
            self.refill_batches += 1
        return {k: np.asarray(v) for k, v in item.items()}

    # -------------------------------------------------------------- one batch

    def _generate_and_compute_advantage(self, training_input, mode=TRAIN):
        if mode != TRAIN:  # evaluation stays uniform: tunix's own path
            return super()._generate_and_compute_advantage(training_input, mode)
        n0 = self.algo_config.num_generations
        first = group_columns(training_input, n0, self.sera.prompt_id_key)
        batch_rows = len(first[self.sera.prompt_id_key]) * n0
        if self.method.dynamic_sampling:
            done: list[_Round] = []

            def draw(i: int) -> ds_lib.Round:
                cols = first if i == 0 else self._next_refill()
                if cols is None:  # data exhausted: an empty round ends the refills
                    return ds_lib.Round(np.zeros(0, np.int32), np.zeros(0), np.zeros(0, int), 1)
                done.append(self._run_round(cols, mode))
                r = done[-1]
                return ds_lib.Round(r.segment_ids, r.rewards,
                                    (r.completion_ids != self._pad).sum(-1), len(r.counts))

            min_group = n0 if self.method.allocator == "uniform" else max(self.sera.n_min, 2)
            rounds, chosen = ds_lib.fill(draw, batch_rows, self.sera.max_rounds, min_group)
            example = self._assemble(done, chosen.rows, chosen.keep)
            extra = {"dapo/generated_rollouts": chosen.generated_rollouts,
                     "dapo/generated_tokens": chosen.generated_tokens,
                     "dapo/rounds": chosen.rounds, "dapo/kept_groups": chosen.num_kept,
                     "dapo/padding_rows": chosen.padding_rows}
        else:
            done = [self._run_round(first, mode)]
            example = self._assemble(done, np.arange(batch_rows), np.ones(batch_rows, bool))
            tokens = int((done[0].completion_ids != self._pad).sum())
            extra = {"dapo/generated_rollouts": batch_rows, "dapo/generated_tokens": tokens}
        self._log(done, extra, mode)
        return example

    @property
    def _pad(self) -> int:
        return self.rl_cluster.rollout.pad_id()

    def _run_round(self, cols: Mapping[str, np.ndarray], mode) -> _Round:
        """Allocate, generate, score and update the history for one group of prompts."""
        n0, s = self.algo_config.num_generations, self.sera
        ids = np.asarray(cols[s.prompt_id_key])
        num = ids.shape[0]
        with self._lock:
            # Epoch e holds drawn prompts e·M .. (e+1)·M − 1; the history folds its pending
            # outcomes in once per epoch, before the first batch that starts in it.
            while self.epochs_started < self.prompts_drawn // s.num_prompts:
                self.history = history_lib.start_epoch(self.history)
                self.epochs_started += 1
            self.prompts_drawn += num
            p_hat = np.asarray(history_lib.lookup(self.history, jnp.asarray(ids)))
        alloc = self.method.allocate(jnp.asarray(p_hat), num * n0, n_min=s.n_min,
                                     n_max=s.n_max, unseen=s.unseen)
        counts = np.asarray(alloc.counts).astype(np.int32)
        weights = np.asarray(self.method.prompt_weights(counts, np.asarray(alloc.weights)))
        seg = np.asarray(estimators.segment_ids_from_counts(jnp.asarray(counts), num * n0))
        rows = take_rows(cols, seg)
        rank = np.asarray(estimators.ranks_in_segments(jnp.asarray(counts), jnp.asarray(seg)))
        rows["trajectory_ids"] = [f"{pid}_{k}" for pid, k in zip(ids[seg], rank)]
        out = self.rl_cluster.generate(
            prompts=list(rows["prompts"]), mode=mode,
            micro_batch_size=(self._rollout_micro_batch_size or num) * n0,
            trace_tags={perf_constants.STEP: self.rl_cluster.global_steps})
        max_len = self.rl_cluster.get_rollout_config(mode).max_tokens_to_generate
        completion_ids = np.stack([tunix_generate_utils.pad_to_length(
            np.asarray(t), target_length=max_len, pad_value=self._pad) for t in out.tokens])
        rewards = np.asarray(self._compute_rewards(
            prompts=list(rows["prompts"]), completions=out.text, mode=mode,
            **{k: v for k, v in rows.items() if k != "prompts"}), np.float32)
        est = estimators.get_advantage_estimator(self.method.estimator)
        adv = np.asarray(est(rewards, seg, num))
        coef = adv * np.asarray(estimators.rollout_weights(weights, seg))
        with self._lock:
            self.history = history_lib.update_from_rollouts(self.history, ids, seg, rewards)
        return _Round(rows, ids, p_hat, counts, seg, rewards, coef.astype(np.float32),
                      list(out.text), completion_ids,
                      np.asarray(out.left_padded_prompt_tokens))

    def _assemble(self, rounds: list[_Round], rows: np.ndarray, keep: np.ndarray):
        """The TrainExample of `rows` of the concatenated rounds (coef 0 where not keep)."""
        width = max(r.prompt_tokens.shape[1] for r in rounds)
        prompts = np.concatenate([tunix_generate_utils.pad_to_length(
            r.prompt_tokens, width, self._pad, left=True, axis=1) for r in rounds])[rows]
        completions = np.concatenate([r.completion_ids for r in rounds])[rows]
        coef = np.where(keep, np.concatenate([r.coef for r in rounds])[rows], 0.0)
        return grpo_learner.TrainExample(
            prompt_ids=jnp.asarray(prompts), prompt_mask=jnp.asarray(prompts != self._pad),
            completion_ids=jnp.asarray(completions),
            completion_mask=jnp.asarray(completions != self._pad),
            ref_per_token_logps=None, old_per_token_logps=None,
            advantages=jax.device_put(coef.astype(np.float32)))

    def _log(self, rounds: list[_Round], extra: Mapping[str, Any], mode) -> None:
        first = rounds[0]
        rewards = np.concatenate([r.rewards for r in rounds])
        lengths = np.concatenate([(r.completion_ids != self._pad).sum(-1) for r in rounds])
        per_prompt = (np.bincount(first.segment_ids, first.rewards, len(first.counts))
                      / np.maximum(first.counts, 1))
        metrics = {"rewards/score/mean": rewards.mean(), "rewards/score/max": rewards.max(),
                   "rewards/score/min": rewards.min(),
                   "completions/mean_length": lengths.mean(),
                   "sera/active_prompts": float(np.sum(first.counts > 0)),
                   "sera/max_count": float(first.counts.max()),
                   "sera/min_active_count": float(first.counts[first.counts > 0].min()),
                   **{k: float(v) for k, v in extra.items()}}
        self.rl_cluster.buffer_metrics({k: (v, np.mean) for k, v in metrics.items()}, mode=mode)
        for fn in self.metric_fns:
            self.rl_cluster.buffer_metrics(fn(
                prompts=list(first.rows["prompts"]), completions=first.completions,
                advantages=first.coef, rewards=first.rewards,
                **{k: v for k, v in first.rows.items() if k != "prompts"}), mode=mode)
        self.records.append({
            "step": int(self.rl_cluster.global_steps), "prompt_ids": first.prompt_ids.tolist(),
            "p_hat": first.p_hat.tolist(), "counts": first.counts.tolist(),
            "reward_per_prompt": per_prompt.tolist(), "reward_mean": float(rewards.mean()),
            "length_mean": float(lengths.mean()), "time": time.perf_counter(),
            "wall_time": time.time(),
            **{k: int(v) for k, v in extra.items()}})


__all__ = ["CHECKPOINT_KEY", "TUNIX_VERSION", "SeraLearner", "SeraOptions", "group_columns",
           "maxrl_advantages", "take_rows", "validate"]
