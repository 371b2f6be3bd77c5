"""The real-model tunix example: SmolLM2-135M-Instruct (the embedded GGUF, float32) in tunix's
Llama-3 on the embedded arithmetic word problems, and the check that `SeraLearner`'s loss
gradient equals our trainer's on one batch.

* `smollm2_policy`: (tunix model, tunix tokenizer, our model) from the embedded weights
  (`sera_jax.integrations.tunix.smollm2`).
* `chat_formatter`: the prompt text, the question plus a short-answer instruction in the
  model's chat template (with its default system prompt, as `sera_jax.tasks.mathqa` asks).
* `gradient_check`: one `SeraLearner` batch (tunix generates the completions; rewards are a
  fixed function of each rollout's rank, `rank_reward`) against our trainer's loss
  (`sera_jax.rl.trainer.rollout_loss`) on the same tokens with the allocation, weights and
  advantages recomputed by `sera_jax.objective` from the same p̂: relative L2 and max |Δ| of
  the flattened gradients.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from tunix.rl import function_registry

from sera_jax import objective
from sera_jax.integrations.tunix import smollm2
from sera_jax.integrations.tunix.learner import SeraLearner, group_columns
from sera_jax.models.decoder import Decoder
from sera_jax.models.embedded import load_smollm2
from sera_jax.rl.state import RolloutBatch
from sera_jax.rl.trainer import rollout_loss

#: The short-answer instruction appended to each question (chat user turn).
SHORT_ANSWER = "Answer with the final number only."
#: Our trainer's loss aggregation -> tunix's `GRPOConfig.loss_agg_mode` with the same loss.
#: "token_mean" is the same formula; "sequence_mean" (÷ P·N0) equals tunix's
#: "sequence-mean-token-mean" (÷ rows with a token) when every row has a completion token.
TUNIX_AGGREGATION = {"token_mean": "token-mean", "sequence_mean": "sequence-mean-token-mean"}


def smollm2_policy(seed: int = 0) -> tuple[Any, smollm2.TunixTokenizer, Decoder]:
    """(tunix Llama-3 with the embedded SmolLM2-135M-Instruct weights, its tokenizer for
    tunix, our float32 `Decoder` of the same weights)."""
    ours, tokenizer = load_smollm2()
    return smollm2.to_tunix(ours, seed), smollm2.TunixTokenizer(tokenizer), ours


def chat_formatter(tokenizer: smollm2.TunixTokenizer, instruction: str = SHORT_ANSWER
                   ) -> Callable[[str], str]:
    """question -> the chat text the model sees (user turn = question + instruction)."""
    def fmt(question: str) -> str:
        text = f"{question} {instruction}".strip()
        return tokenizer.tokenizer.chat_prompt(text)
    return fmt


def rank_reward(prompts: Sequence[str], completions: Sequence[str],
                trajectory_ids: Sequence[str], **_: Any) -> list[float]:
    """A fixed binary reward for gradient checks: 1 iff the rollout's rank within its prompt
    (the "<prompt id>_<rank>" trajectory id `SeraLearner` assigns) is even."""
    del prompts, completions
    return [float(int(str(t).rsplit("_", 1)[1]) % 2 == 0) for t in trajectory_ids]


def _array(x: Any) -> jax.Array:
    return jnp.asarray(x.value if isinstance(x, nnx.Variable) else x)


def _at(tree: Any, path: tuple) -> jax.Array:
    for key in path:
        tree = tree[key]
    return _array(tree)


def gradient_check(learner: SeraLearner, ours: Decoder, training_input: Mapping[str, Any],
                   aggregation: str = "token_mean") -> dict[str, Any]:
    """The first-step loss gradient of `learner` (tunix's GRPO loss on the `TrainExample`
    its `_generate_and_compute_advantage` builds for `training_input`, a batch with every
    prompt repeated N0 times) against our trainer's (`rollout_loss` on `ours`, same tokens).

    The learner must use `rank_reward` and `GRPOConfig.loss_agg_mode =
    TUNIX_AGGREGATION[aggregation]`; our side re-plans the allocation from the recorded p̂
    (`objective.plan_rollouts`) and recomputes rewards, advantages and weights. Returns the
    counts, the relative L2 ‖g_tunix − g_ours‖/‖g_ours‖, max |Δ|, max |g_ours|, the largest
    difference of the loss coefficients w·A, both loss values, and the relative L2 to our
    gradient without the N0/N_q weights (how far a wrong weighting lands). The loss values
    differ by construction, the gradients do not: tunix's GRPO term is −c_r·exp(ℓ − sg(ℓ)),
    whose value is −c_r (ratio 1), ours is −c_r·ℓ (c_r = w_r·A_r, ℓ the token log-prob).
    """
    algo, s = learner.algo_config, learner.sera
    if algo.loss_agg_mode != TUNIX_AGGREGATION[aggregation]:
        raise ValueError(f"loss_agg_mode={algo.loss_agg_mode!r}; our {aggregation!r} is "
                         f"tunix's {TUNIX_AGGREGATION[aggregation]!r}")
    n0 = algo.num_generations
    num = len(group_columns(training_input, n0, s.prompt_id_key)[s.prompt_id_key])
    example = learner._generate_and_compute_advantage(training_input)
    record = learner.records[-1]

    method = learner.method
    plan = objective.plan_rollouts(method, jnp.asarray(record["p_hat"], jnp.float32),
                                   num * n0, n_min=s.n_min, n_max=s.n_max, unseen=s.unseen)
    if np.asarray(plan.counts).tolist() != record["counts"]:
        raise AssertionError(f"counts differ: ours {plan.counts}, tunix {record['counts']}")
    ranks = np.asarray(plan.ranks)
    rewards = jnp.asarray(ranks % 2 == 0, jnp.float32)
    advantages, weights = objective.rollout_coefficients(rewards, plan, method.estimator)
    completion_mask = jnp.asarray(example.completion_mask, bool)
    batch = RolloutBatch(jnp.asarray(example.prompt_ids), jnp.asarray(example.prompt_mask, bool),
                         jnp.asarray(example.completion_ids), completion_mask,
                         advantages, weights)
    width = int(completion_mask.shape[1])
    num_tokens = jnp.sum(completion_mask, dtype=jnp.float32)

    def our_loss(model: Decoder, w: jax.Array) -> jax.Array:
        return rollout_loss(model, batch.replace(weights=w), aggregation=aggregation,
                            num_prompts=num, n0=n0, max_len=width, num_tokens=num_tokens)

    tunix_fn = function_registry.get_policy_loss_fn("grpo")
    pad, eos = learner.rl_cluster.rollout.pad_id(), learner.rl_cluster.rollout.eos_id()
    model = learner.rl_cluster.actor_trainer.model
    loss_t, g_t = nnx.value_and_grad(lambda m: tunix_fn(
        m, example, algo_config=algo, pad_id=pad, eos_id=eos)[0])(model)
    grad_ours = nnx.value_and_grad(our_loss)
    loss_o, g_o = grad_ours(ours, weights)
    _, g_flat = grad_ours(ours, jnp.ones_like(weights))

    pairs = smollm2.param_pairs(ours.cfg.num_layers, ours.cfg.tie_embeddings)
    flat = lambda g, side: jnp.concatenate([_at(g, p[side]).ravel() for p in pairs])  # noqa: E731
    vt, vo, vf = flat(g_t, 1), flat(g_o, 0), flat(g_flat, 0)
    norm = float(jnp.linalg.norm(vo))
    return {
        "counts": record["counts"], "p_hat": record["p_hat"],
        "rows": int(completion_mask.shape[0]), "completion_tokens": int(num_tokens),
        "coef_max_abs_diff": float(jnp.max(jnp.abs(jnp.asarray(example.advantages)
                                                   - advantages * weights))),
        "loss_tunix": float(loss_t), "loss_ours": float(loss_o),
        "grad_rel_l2": float(jnp.linalg.norm(vt - vo)) / norm,
        "grad_max_abs_diff": float(jnp.max(jnp.abs(vt - vo))),
        "grad_max_abs": float(jnp.max(jnp.abs(vo))), "grad_norm": norm,
        "unweighted_rel_l2": float(jnp.linalg.norm(vf - vo)) / norm,
        "num_params": int(vo.shape[0]),
    }


__all__ = ["SHORT_ANSWER", "TUNIX_AGGREGATION", "chat_formatter", "gradient_check",
           "rank_reward", "smollm2_policy"]
