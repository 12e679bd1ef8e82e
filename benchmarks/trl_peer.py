"""A peer, side by side: TRL's ``GRPOTrainer`` against agentrl on a recipe's calculator task
(``--recipe``: the tiny model's ``recipes/tiny_calc.toml`` by default, issues 22 and 33;
SmolLM2-135M-Instruct's ``recipes/smol_calc.toml``, issue 34), interleaved in one invocation over
several seeds.

Same start (the SFT checkpoint ``--sft``, default ``runs/<recipe name>/sft``), same task (the
recipe's environment, ``agentrl/Calc-v0`` in both recipes: the model writes Python in
``<code>...</code>``, the interpreter answers in ``<interpreter>``, up to the environment's
``max_turns`` turns, reward 1 for the right ``\\boxed{}``), same machine, same samples
(``--steps`` x the recipe's ``learner.batch_size`` episodes per step, ``rollout.group_size`` per
prompt: 32 = 8 x 4 for tiny_calc, 16 = 4 x 4 for smol_calc), same tokens (``rollout.max_new_tokens``
a turn, ``rollout.max_episode_tokens`` an episode, a turn ends at ``rollout.stop`` or EOS), same
hyper-parameters (every one read from the recipe, :func:`grpo_config_kwargs`; a recipe whose
objective or schedule TRL cannot run alike is refused, :func:`peer_settings`), same dtype (the
recipe's ``model.dtype``; ``"auto"`` is resolved once here, :func:`resolve_dtype`, and given to
both sides and to every evaluation), same held-out measurement (agentrl's own evaluator on the
recipe's ``eval.limit`` problems at its ``eval.temperature``).

The SFT checkpoint
------------------
Both sides start from the model after the recipe's SFT stage. ``mode = "sft"`` runs that stage
and ends the run before RL (the controller returns after ``run_sft``), writing the model to
``<run_dir>/sft``; for SmolLM2 (10 SFT steps of 16 demonstrations, the model imported from its
GGUF file on the first run)::

    flock /tmp/agentrl-heavy.lock .venv/bin/agentrl train recipes/smol_calc.toml --set mode=sft --set run_dir=runs/smol_calc
    # -> runs/smol_calc/sft (the tiny model's: the same with recipes/tiny_calc.toml and runs/tiny_calc)

The whole recipe (``agentrl train recipes/smol_calc.toml``) leaves the same folder in
``runs/smol_calc/sft`` on the way. Without ``--sft`` the script looks in ``runs/<recipe name>/sft``
and, when nothing is there, prints the command above.

Seeds and order
---------------
For every seed ``s`` of ``--seeds`` (default ``0,1,2``) both sides run, one after the other, each
in its own process timed by this script with the same clock (``time.monotonic`` around the child
process):

- **TRL**: this script run again as a child (``--trl-child``), ``GRPOConfig(seed=s, data_seed=s)``,
  the training rows ``load_rows(data.source, limit=data.limit, seed=s)`` (the rows agentrl's run
  with ``seed=s`` trains on), checkpoints ``out/seed{s}/trl/ckpt-<step>`` every ``--save-every``
  steps;
- **agentrl**: ``agentrl train <--recipe> --set seed=s`` from the same SFT checkpoint
  (``sft.steps=0``, ``learner.max_steps=--steps``, ``eval.every_steps=--save-every``,
  ``learner.max_degenerate_steps=0`` so that it trains every step as TRL does, and ``model.dtype``
  set to the resolved dtype when the recipe asks for ``"auto"``; :func:`agentrl_overrides`) in
  ``out/seed{s}/agentrl``.

The side that goes first alternates: the first seed listed runs TRL first, the second agentrl
first, and so on, so that a drift of the machine's load does not favour one side. The load
average (``os.getloadavg()``) is recorded before and after every run. After both trainings of a
seed, every TRL checkpoint of that seed is scored by agentrl's evaluator (``agentrl train ...
mode="eval" seed=s``, ``out/seed{s}/trl_eval/step-<step>``): the evaluation rows and every turn's
sampling seed derive from the recipe's ``seed`` (``load_rows(..., split="test", seed=seed)`` and
``rollout.seed_sampling``), so with ``seed=s`` every TRL checkpoint of seed ``s`` is scored on the
same ``eval.limit`` problems with the same sampling seeds as agentrl's own evaluations in its seed-``s``
run; the step-0 evaluations of the two sides score the same SFT checkpoint and are printed side
by side as a check. Seeds differ in training rows, evaluation rows and sampling.

``--reuse`` reads a finished run (per seed and side: its record ``out/seed{s}/<side>.bench.json``
is written only when the run succeeded, with the settings it ran with: steps, save_every,
no_eval, sft, recipe and dtype; a record older than the last two was the tiny recipe in float32)
and a finished evaluation instead of running them again; a run made with other settings is
refused.
The single-seed option ``--agentrl-run DIR`` (agentrl's side read from an earlier run) is gone:
every seed needs its own agentrl run measured beside its TRL run, and ``--reuse`` re-reads them.

Clocks
------
- **RL loop** (samples/s and wall-clock to an accuracy): TRL's training seconds = wall-clock since
  ``on_train_begin`` minus the time spent saving checkpoints (model loading and trainer set-up
  excluded). agentrl's = the loop's wall-clock in its ``utilisation`` record (``rl_wall_s``: loop
  start to the last step's weights loaded; Ray, vLLM and sandbox start-up, the final checkpoint
  write and the step-0 and final evaluations are outside it) minus the seconds of the evaluations
  inside the loop; its time at an evaluation is :func:`_measure.eval_curve`'s ``rl_s`` (time since
  the loop's start without evaluation time).
- **Whole command**: the child process from start to exit. TRL's includes Python start-up, model
  loading, trainer set-up, training and saving; agentrl's also includes its evaluations (shown
  beside it, from the ``eval_s`` of its evaluation records), Ray, the vLLM engine and the sandbox.
- **Time per step**: TRL's from its per-step clock (``trl_steps.jsonl``: the step, of it HF
  ``generate`` and the environment/sandbox, the rest = loss, backward, optimiser and TRL's own
  work), medians over the steps. agentrl's from the step records of its ``metrics.jsonl``: the
  interval between step records, the learner rank's ``train_s`` (of it ``step_forward_backward_s``
  and ``step_optimizer_s``), ``step_transfer_s`` (the batch's way to the rank and back),
  ``publish_s`` (publishing the new weights), ``update_stall_s`` (the longest generator stall for
  the update) and ``generator_sleep_s`` (the hand-over: generators put to sleep before training,
  colocated mode), medians over the steps. agentrl logs no per-step generation or sandbox seconds:
  the interval less ``learner_busy_s`` (training, transfer and publishing) is the time a step
  waited for its episodes (colocated, as on this machine: the generation phase, sandbox
  included), and its ``utilisation`` record gives the generator's and the learner's busy
  fractions of the loop.

The goal is checked as stated, per recipe (:data:`GOALS`). tiny_calc, issue 33: agentrl trains
>= 1.3x TRL's samples per second (the median over seeds of the per-seed ratio agentrl/TRL,
RL-loop clocks) and reaches TRL's final held-out accuracy in less wall-clock (per seed: agentrl's
first evaluation at or above TRL's final accuracy of that seed comes at fewer RL-loop seconds
than TRL's first checkpoint at or above it; met when that holds in more than half of the seeds).
Any other recipe (a real model: smol_calc), issue 34: >= 1.5x the samples per second, and TRL's
final accuracy reached in <= 2/3 of TRL's RL-loop seconds to it, in more than half of the seeds.
Both parts must hold. The results go to RESULTS.md's block ``trl_peer`` for tiny_calc and
``trl_peer <recipe name>`` for any other (:func:`result_key`), so that both stand side by side;
a bfloat16 run's block adds the dtype (``trl_peer smol_calc bfloat16``).

The TRL setup, and what differs from agentrl's
-----------------------------------------------
- **Trainer**: ``trl.GRPOTrainer`` (TRL 1.16, ``pip install -e '.[bench]'``) with its best CPU
  settings: generation with Hugging Face ``generate`` batched over every open episode of the step
  (TRL's default; its vLLM modes need a GPU or a vLLM server) with the KV cache
  (``use_cache=True``), torch on all the machine's threads (``torch.set_num_threads(cpu_count)``),
  no gradient checkpointing, dropout off (as TRL does by default); weights loaded in float32 and,
  when the run's dtype is bfloat16, ``bf16=True`` (autocast: bfloat16 compute over float32 weights,
  as agentrl's learner trains under bfloat16). Both recipes set ``model.dtype = "float32"``.
- **Multi-turn tool use**: TRL's built-in tool loop (``tools=`` / ``environment_factory=``) parses
  tool calls with the chat template's response schema (Hermes-style ``<tool_call>{json}</tool_call>``)
  and renders tool results with the template's ``tool`` role; both models (the tiny one and SmolLM2)
  are SFT-trained on ReTool-style ``<code>`` blocks, and their templates have no response schema
  (SmolLM2's has no tool role at all), so that loop cannot drive them. The closest TRL setup is TRL's ``rollout_func`` hook (experimental, the one TRL documents
  for custom multi-turn environments), written here to do what TRL's own tool loop does, in
  agentrl's format: generate one turn for every open episode in a batch with TRL's own
  ``GRPOTrainer._generate_single_turn`` (HF ``generate`` under ``unwrap_model_for_generation``,
  TRL's generation config: the recipe's temperature and top-p, ``max_completion_length`` = the
  recipe's ``max_new_tokens`` per turn), hand each turn to agentrl's environment
  (``agentrl.envs.make_env(env.id, **env.kwargs)``, code run in agentrl's sandbox with the
  recipe's limits), append the template glue with agentrl's ``IncrementalRenderer`` (so token
  streams are built exactly as agentrl builds them), and return ``env_mask`` (TRL's name for the
  loss mask: tool output and glue are not trained on).
- **Where a turn ends** (:func:`turn_stops`): at EOS (``<|im_end|>``) or at a stop string of
  ``rollout.stop`` (``</code>``), the stop string kept in the turn, as agentrl's generator keeps it
  (vLLM with ``include_stop_str_in_output``: the token that completes the string is kept whole).
  A stop string that is one token in the tokenizer (the tiny tokenizer's ``</code>``) is added to
  the EOS ids of TRL's generation config and of its completion masking, as before. One the
  tokenizer writes with several tokens (SmolLM2's ``</code>`` is ``</``, ``code``, ``>``) is
  given to HF ``generate`` as HF's own ``StopStringCriteria`` (built once,
  :func:`stop_on_strings`): the sequence stops at the string while the rest of the batch runs
  on; HF fills the stopped row with the pad token, which is SmolLM2's EOS, so TRL's masking would
  keep one padding ``<|im_end|>``: :func:`end_of_turn` cuts the turn after the token that
  completes the string.
- **Reward**: the environment's own (``CalcEnv.score``: last ``\\boxed{}`` equal to the answer),
  passed to TRL as an extra rollout field and returned by a one-line reward function; so correctness
  is judged identically.
- **Objective**: ``loss_type="dapo"`` (TRL's default: token-mean over the batch, as agentrl's
  ``token-mean``), ``epsilon=0.2``, ``epsilon_high=0.28`` (agentrl's clip 0.2/0.28), ``beta=0`` (no
  KL, as agentrl), ``scale_rewards="group"`` (group mean and std, as agentrl's ``grpo``
  advantage), ``num_iterations=1``. TRL is on-policy (generate, then one step), so its ratio is 1
  and clipping never acts. agentrl's recipe allows samples one version old (``max_staleness =
  1``, decoupled clipping, a dual clip of 3), but on one CPU machine ``placement.mode = "auto"``
  makes it colocated (its log's first lines say so): generation and training take turns and the
  staleness bound in force is 0, so both sides train on-policy here; on separate devices (GPUs)
  agentrl would overlap them and train on samples up to one version old.
- **Optimiser**: AdamW with the recipe's ``learner`` settings: lr (1e-4 tiny_calc, 2e-5
  smol_calc) constant (with the recipe's warm-up steps, none in either), betas, eps, weight decay,
  gradient-norm clip; one optimiser step per ``learner.batch_size`` episodes.
- **Data**: the same training rows per seed (``load_rows(data.source, limit=data.limit,
  seed=s)``: 512 synthetic:calc problems in both recipes), in TRL's sampler order
  (``data_seed=s``) rather than agentrl's; the held-out rows are agentrl's eval split for that
  seed, read by agentrl's evaluator itself.

Commands (every heavy command under the shared lock)::

    # smoke: 2 seeds, 2 steps, checkpoints at steps 0 and 2, each evaluated
    flock /tmp/agentrl-heavy.lock .venv/bin/python benchmarks/trl_peer.py --seeds 0,1 --steps 2 --save-every 2 --out runs/bench_trl_peer_smoke
    # the full run: 3 seeds x 2 sides x 120 steps, checkpoints every 20, each evaluated; the report
    # printed (add --write to also put it into RESULTS.md, block trl_peer)
    flock /tmp/agentrl-heavy.lock .venv/bin/python benchmarks/trl_peer.py --seeds 0,1,2 --steps 120 --save-every 20
    # re-read the finished runs and evaluations (no training, no evaluation) and write the block
    .venv/bin/python benchmarks/trl_peer.py --seeds 0,1,2 --steps 120 --save-every 20 --reuse --write
    # SmolLM2-135M-Instruct (issue 34): its SFT checkpoint first (above), then 3 seeds x 2 sides x 20
    # steps of 16 episodes, checkpoints every 10 steps, each evaluated (block "trl_peer smol_calc")
    flock /tmp/agentrl-heavy.lock .venv/bin/python benchmarks/trl_peer.py --recipe recipes/smol_calc.toml \\
        --sft runs/smol_calc/sft --seeds 0,1,2 --steps 20 --save-every 10 --out runs/bench_trl_peer_smol
    # one TRL checkpoint scored by agentrl's evaluator, as the script does it (seed s = 1 here):
    .venv/bin/agentrl train recipes/tiny_calc.toml --set mode="eval" --set seed=1 \\
        --set model.path="runs/bench_trl_peer/seed1/trl/ckpt-20" --set sft.steps=0 \\
        --set run_dir="runs/bench_trl_peer/seed1/trl_eval/step-20"
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from statistics import mean, median
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _measure import agentrl_train, dtype_key, emit, eval_curve, run_header

ROOT = Path(__file__).resolve().parent.parent
RECIPE = "recipes/tiny_calc.toml"
"""The default ``--recipe``: the tiny calculator task (issues 22 and 33)."""
SIDES = ("TRL", "agentrl")
LEGACY_SETTINGS = {"recipe": RECIPE, "dtype": "float32"}
"""Settings a run record written before they were recorded was made with (``--reuse``): every
earlier run was the tiny recipe in float32."""


# ------------------------------------------------------------------ what the recipe sets


@dataclass(frozen=True)
class GoalRule:
    """A peer goal: agentrl's samples/s at least ``speedup`` times TRL's (median over seeds of the
    per-seed ratio), and, in more than half of the seeds, agentrl's first evaluation at or above
    TRL's final held-out accuracy at no more than ``within`` times TRL's RL-loop seconds to it
    (``inclusive``: ``<=``; otherwise strictly ``<``)."""

    issue: int
    speedup: float
    within: float = 1.0
    inclusive: bool = False

    @property
    def share(self) -> str:
        """``within`` as a fraction (``2/3``)."""
        from fractions import Fraction

        return str(Fraction(self.within).limit_denominator(12))

    def statement(self) -> str:
        """The goal in the issue's words."""
        when = "in less wall-clock" if self.within == 1.0 and not self.inclusive else \
            f"in {'<=' if self.inclusive else '<'} {self.share} of TRL's wall-clock"
        return (f"agentrl trains >= {self.speedup}x TRL's samples per second and reaches TRL's final held-out accuracy {when}")


TINY_GOAL = GoalRule(issue=33, speedup=1.3)
"""Issue 33 (the tiny task): >= 1.3x the samples/s, TRL's final accuracy in less wall-clock."""
REAL_MODEL_GOAL = GoalRule(issue=34, speedup=1.5, within=2 / 3, inclusive=True)
"""Issue 34 (SmolLM2-135M-Instruct, smol_calc): >= 1.5x the samples/s, TRL's final accuracy in
<= 2/3 of TRL's wall-clock."""
GOALS = {"tiny_calc": TINY_GOAL}
"""The goal per recipe name; every other recipe (a real model) gets :data:`REAL_MODEL_GOAL`."""


def result_key(recipe_name: str, dtype: str = "float32") -> str:
    """The RESULTS.md block of a recipe's comparison: ``trl_peer`` for ``tiny_calc`` (the block
    the first comparisons wrote), ``trl_peer <name>`` for any other, so that each recipe's block
    stands beside the others; a run in another dtype than float32 (``dtype``, the resolved
    ``model.dtype``) gets a block of its own beside its recipe's float32 one
    (``trl_peer smol_calc bfloat16``)."""
    return dtype_key("trl_peer" if recipe_name == "tiny_calc" else f"trl_peer {recipe_name}", dtype)


@dataclass(frozen=True)
class PeerSettings:
    """What both sides take from the recipe (``--recipe``), named for the report."""

    name: str
    """The recipe's ``name`` (``tiny_calc``, ``smol_calc``)."""
    episodes_per_step: int
    """Episodes per optimiser step on both sides: ``learner.batch_size``."""
    group_size: int
    """Episodes per prompt (``rollout.group_size``; TRL's ``num_generations``)."""
    max_new_tokens: int
    """New tokens per turn (``rollout.max_new_tokens``; TRL's ``max_completion_length``)."""
    max_turns: int
    """Model turns per episode (the environment's ``max_turns``, 3 when the recipe leaves it out)."""
    stops: tuple[str, ...]
    """Strings that end a turn (``rollout.stop``), kept in the output."""
    temperature: float
    """Sampling temperature in training (``rollout.temperature``)."""
    lr: float
    """``learner.lr``."""
    clip: tuple[float, float]
    """``(algo.clip_low, algo.clip_high)``."""
    kl_coef: float
    """``algo.kl_coef`` (TRL's ``beta``)."""
    eval_limit: int
    """Held-out problems per evaluation (``eval.limit``)."""
    eval_temperature: float
    """Sampling temperature of the evaluations (``eval.temperature``)."""
    data: str
    """The training rows: ``data.source`` and, when set, ``data.limit``."""
    env: str
    """``env.id``."""

    @property
    def prompts_per_step(self) -> int:
        return self.episodes_per_step // self.group_size

    @property
    def key(self) -> str:
        """The RESULTS.md block (:func:`result_key`)."""
        return result_key(self.name)

    @property
    def goal(self) -> GoalRule:
        """The goal this recipe's comparison is checked against (:data:`GOALS`)."""
        return GOALS.get(self.name, REAL_MODEL_GOAL)


def peer_settings(recipe: Any) -> PeerSettings:
    """The settings both sides use, read from ``recipe`` (an :class:`agentrl.config.Recipe`).
    Raises ValueError for a recipe whose objective, schedule or batch TRL's ``GRPOTrainer`` cannot
    run as agentrl does (:func:`grpo_config_kwargs` maps the rest), so that the comparison never
    silently trains two different things."""
    a, lr, ro = recipe.algo, recipe.learner, recipe.rollout
    problems = []
    if a.advantage != "grpo" or not a.normalize_advantages:
        problems.append(f"algo.advantage={a.advantage!r} normalize_advantages={a.normalize_advantages} (TRL: group mean and std, "
                        "agentrl's grpo with normalised advantages)")
    if a.policy_loss != "ppo" or a.loss_agg != "token-mean":
        problems.append(f"algo.policy_loss={a.policy_loss!r} loss_agg={a.loss_agg!r} (TRL's dapo loss: ppo clipping, token-mean)")
    if a.kl_coef and a.kl_estimator != "k3":
        problems.append(f"algo.kl_estimator={a.kl_estimator!r} with a KL term (TRL's is k3)")
    if a.updates_per_batch != 1:
        problems.append(f"algo.updates_per_batch={a.updates_per_batch} (one optimiser step per batch on both sides)")
    if a.dynamic_sampling != "off" or a.filter_zero_variance_groups or a.overlong_max_tokens is not None:
        problems.append("algo.dynamic_sampling, filter_zero_variance_groups or overlong_max_tokens (TRL has no counterpart here)")
    if lr.lr_schedule != "constant":
        problems.append(f"learner.lr_schedule={lr.lr_schedule!r} (only 'constant', with or without warm-up, is mapped to TRL's)")
    if problems:
        raise ValueError("trl_peer cannot run this recipe on TRL as agentrl runs it: " + "; ".join(problems))
    data = recipe.data.source + (f" (limit {recipe.data.limit})" if recipe.data.limit else "")
    stops = tuple([ro.stop] if isinstance(ro.stop, str) else ro.stop or ())
    return PeerSettings(name=recipe.name, episodes_per_step=lr.batch_size, group_size=ro.group_size, max_new_tokens=ro.max_new_tokens,
                        max_turns=int(recipe.env.kwargs.get("max_turns", 3)), stops=stops, temperature=ro.temperature, lr=lr.lr,
                        clip=(a.clip_low, a.clip_high), kl_coef=a.kl_coef, eval_limit=recipe.eval.limit,
                        eval_temperature=recipe.eval.temperature, data=data, env=recipe.env.id)


def grpo_config_kwargs(recipe: Any, dtype: str) -> dict[str, Any]:
    """``GRPOConfig`` keyword arguments that make TRL train as ``recipe`` makes agentrl train
    (:func:`peer_settings` first refuses what cannot be mapped), with TRL's best CPU settings:
    HF ``generate`` with the KV cache (``use_cache``), no gradient checkpointing, and, when
    ``dtype`` (the run's resolved ``model.dtype``, :func:`resolve_dtype`) is ``"bfloat16"``,
    ``bf16=True`` (mixed precision: float32 weights, bfloat16 compute, as agentrl's learner).
    The run-specific ones (output folder, steps, seed, stop ids, logging) are added by the caller."""
    if dtype not in ("float32", "bfloat16"):
        raise ValueError(f"model.dtype {dtype!r}: TRL on the CPU runs float32 or bfloat16 (bf16=True) here")
    peer = peer_settings(recipe)
    lr, ro, a = recipe.learner, recipe.rollout, recipe.algo
    return dict(
        per_device_train_batch_size=peer.episodes_per_step,
        gradient_accumulation_steps=1,
        num_generations=peer.group_size,
        learning_rate=lr.lr,
        lr_scheduler_type="constant_with_warmup" if lr.warmup_steps else "constant",
        warmup_steps=lr.warmup_steps,
        weight_decay=lr.weight_decay,
        adam_beta1=lr.betas[0],
        adam_beta2=lr.betas[1],
        adam_epsilon=lr.adam_eps,
        max_grad_norm=lr.grad_clip,
        optim="adamw_torch",
        temperature=ro.temperature,
        top_p=ro.top_p,
        max_completion_length=ro.max_new_tokens,
        beta=a.kl_coef,
        loss_type="dapo",
        epsilon=a.clip_low,
        epsilon_high=a.clip_high,
        scale_rewards="group",
        num_iterations=1,
        use_vllm=False,
        use_cpu=True,
        bf16=dtype == "bfloat16",
        fp16=False,
        gradient_checkpointing=False,
    )


def resolve_dtype(recipe: Any) -> str:
    """``model.dtype`` as an agentrl run of ``recipe`` on this machine resolves it
    (:func:`agentrl.dtype_plan.plan_dtype`, CPUs: ``"auto"`` measures a bfloat16 matrix product
    against float32); the script resolves it once and gives the result to both sides."""
    from agentrl.dtype_plan import plan_dtype

    return plan_dtype(recipe.model.dtype, gpu=False, explicit="dtype" in recipe.model.model_fields_set).dtype


# ------------------------------------------------------------------ where a turn ends


@dataclass(frozen=True)
class TurnStops:
    """How TRL's generation ends a turn as agentrl's does (``rollout.stop``, kept in the output)."""

    eos_ids: tuple[int, ...]
    """The tokenizer's EOS id and the ids of the stop strings that are one token each
    (:func:`agentrl.engine.episodes.stops.single_token_ids`): TRL's EOS ids (generation and
    completion masking), as before for the tiny tokenizer's ``</code>``."""
    strings: tuple[str, ...]
    """The stop strings the tokenizer writes with several tokens (SmolLM2's ``</code>`` is
    ``</``, ``code``, ``>``): HF ``generate`` stops on them (:class:`StopStringCriteria`) and
    :func:`end_of_turn` cuts the turn after the token that completes one."""


def turn_stops(tokenizer: Any, stops: tuple[str, ...] | list[str]) -> TurnStops:
    """The :class:`TurnStops` of ``stops`` for ``tokenizer``."""
    from agentrl.engine.episodes.stops import single_token_ids

    single = single_token_ids(tokenizer, list(stops))
    if tokenizer.eos_token_id is None:
        raise ValueError("the tokenizer has no EOS token")
    eos = [int(tokenizer.eos_token_id), *(i for i in single if i != tokenizer.eos_token_id)]
    strings = [s for s in stops if not any(tokenizer.decode([i], skip_special_tokens=False) == s for i in single)]
    return TurnStops(eos_ids=tuple(eos), strings=tuple(strings))


def end_of_turn(ids: list[int], tokenizer: Any, strings: tuple[str, ...] | list[str]) -> int:
    """How many of a turn's generated ``ids`` agentrl keeps: up to and including the first token
    whose text completes one of ``strings`` (as vLLM with ``include_stop_str_in_output``: the
    token that completes the string is kept whole), or all of them when none occurs."""
    if not strings:
        return len(ids)
    for k in range(1, len(ids) + 1):
        text = tokenizer.decode(ids[:k], skip_special_tokens=False)
        if any(s in text for s in strings):
            return k
    return len(ids)


def stop_on_strings(model: Any, tokenizer: Any, strings: tuple[str, ...]) -> None:
    """Make ``model.generate`` (the call TRL's ``_generate_single_turn`` makes) stop each sequence
    at any of ``strings``: HF's own :class:`StopStringCriteria`, built once here (building it reads
    the whole vocabulary, about 0.6 s for SmolLM2's; HF would rebuild it on every call given
    ``stop_strings``) and passed as a stopping criterion. Nothing changes without ``strings``."""
    if not strings:
        return
    import functools

    from transformers.generation.stopping_criteria import StoppingCriteriaList, StopStringCriteria

    criteria = StoppingCriteriaList([StopStringCriteria(tokenizer, list(strings))])
    model.generate = functools.partial(model.generate, stopping_criteria=criteria)


# ------------------------------------------------------------------ the rollout TRL runs


class CalcRollout:
    """TRL ``rollout_func``: multi-turn Calc-v0 episodes, one HF ``generate`` call per turn for all
    open episodes of the batch, agentrl's environment and renderer between turns."""

    def __init__(self, recipe: Any, tokenizer: Any, rows: list[dict[str, Any]], stop_strings: tuple[str, ...] = ()) -> None:
        """``stop_strings``: the recipe's stop strings that are several tokens
        (:attr:`TurnStops.strings`): each turn is cut after the token that completes one."""
        from agentrl.sandbox import create_sandbox

        self.recipe = recipe
        self.tokenizer = tokenizer
        self.stop_strings = stop_strings
        self.answers = {r["question"]: r for r in rows}
        sb = recipe.sandbox
        kwargs: dict[str, Any] = {"max_concurrency": sb.max_concurrency, "timeout_s": sb.timeout_s, "memory_mb": sb.memory_mb}
        if sb.preload is not None:
            kwargs["preload"] = sb.preload
        self.loop = asyncio.new_event_loop()
        self.sandbox = create_sandbox(sb.type, **kwargs)
        self.max_turns = int(recipe.env.kwargs.get("max_turns", 3))
        self.max_episode_tokens = min(recipe.rollout.max_episode_tokens, recipe.generator.max_model_len)
        self.max_new_tokens = recipe.rollout.max_new_tokens
        self.generate_s = self.env_s = 0.0
        self.samples_path: Path | None = None

    def close(self) -> None:
        self.loop.run_until_complete(self.sandbox.aclose())
        self.loop.close()

    def __call__(self, prompts: list[list[dict[str, str]]], trainer: Any) -> dict[str, Any]:
        from agentrl.engine.episodes.render import IncrementalRenderer
        from agentrl.envs import make_env

        n = len(prompts)
        envs, renderers, prompt_ids = [], [], []
        for messages in prompts:
            row = self.answers[messages[-1]["content"]]
            env = make_env(self.recipe.env.id, **{**self.recipe.env.kwargs, "sandbox": self.sandbox})
            env.unwrapped.reset(options={"row": row})
            envs.append(env)
            renderers.append(IncrementalRenderer(self.tokenizer, messages))
            prompt_ids.append(renderers[-1].prompt_ids())
        completion: list[list[int]] = [[] for _ in range(n)]
        mask: list[list[int]] = [[] for _ in range(n)]
        reward = [0.0] * n
        turns = [0] * n
        tool_calls = [0] * n
        open_ = list(range(n))
        while open_:
            # one turn for every open episode: TRL's own HF-generate path
            budgets = {i: min(self.max_new_tokens, self.max_episode_tokens - len(prompt_ids[i]) - len(completion[i])) for i in open_}
            open_ = [i for i in open_ if budgets[i] > 0]  # agentrl: status "overflow"
            if not open_:
                break
            t0 = time.monotonic()
            ids, _ = trainer._generate_single_turn([prompt_ids[i] + completion[i] for i in open_], None, {}, 1)
            self.generate_s += time.monotonic() - t0
            texts = []
            for i, gen in zip(open_, ids):
                gen = list(gen)[: budgets[i]]
                gen = gen[: end_of_turn(gen, self.tokenizer, self.stop_strings)]  # HF pads a stopped sequence: cut at the stop
                completion[i] += gen
                mask[i] += [1] * len(gen)
                turns[i] += 1
                texts.append(self.tokenizer.decode(gen, skip_special_tokens=False))
            t0 = time.monotonic()
            async def step_all(pairs: list[tuple[int, str]]) -> list[Any]:
                return await asyncio.gather(*(envs[i].unwrapped.astep(renderers[i].strip_special_suffix(t)) for i, t in pairs))

            steps = self.loop.run_until_complete(step_all(list(zip(open_, texts))))
            self.env_s += time.monotonic() - t0
            still = []
            for i, text, (obs, r, terminated, truncated, info) in zip(open_, texts, steps):
                reward[i] += float(r)
                tool_calls[i] = int(info.get("tool_calls", tool_calls[i]))
                if terminated or truncated or turns[i] >= self.max_turns:
                    continue
                glue = renderers[i].append_turn(text, obs)
                if len(prompt_ids[i]) + len(completion[i]) + len(glue) >= self.max_episode_tokens:
                    continue  # agentrl: status "overflow"
                completion[i] += glue
                mask[i] += [0] * len(glue)
                still.append(i)
            open_ = still
        if self.samples_path is not None:  # one readable episode per batch
            with open(self.samples_path, "a") as f:
                f.write(json.dumps({"step": trainer.state.global_step, "episodes": n, "reward": reward[0], "turns": turns[0],
                                    "text": self.tokenizer.decode(prompt_ids[0] + completion[0])}) + "\n")
        return {"prompt_ids": prompt_ids, "completion_ids": completion, "logprobs": None, "env_mask": mask,
                "env_reward": reward, "env_tool_calls": tool_calls}


def env_reward(prompts: list, completions: list, env_reward: list[float], **_: Any) -> list[float]:
    """The reward agentrl's CalcEnv gave the episode (computed during the rollout)."""
    return list(env_reward)


# ------------------------------------------------------------------ training (the TRL child process)


def train_trl(recipe_path: str, dtype: str, steps: int, save_every: int, sft: str, seed: int, out: Path) -> None:
    """Run GRPOTrainer on ``recipe_path``'s task and settings (:func:`grpo_config_kwargs`), in
    ``dtype`` (the resolved ``model.dtype``), with ``seed`` for ``steps`` steps from the checkpoint
    ``sft``, saving ``out/ckpt-<step>`` every ``save_every`` steps and at the last. Writes ``out/trl_clock.json``
    (``[{step, train_s, path, generate_s, env_s}]`` at each checkpoint, step 0 = the SFT checkpoint
    at 0 s; seconds cumulative, saving excluded), ``out/trl_steps.jsonl`` (the same cumulative
    seconds after every step) and ``out/trl_logs.jsonl`` (TRL's logged numbers per step)."""
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from agentrl.config import load_recipe
    from agentrl.envs import make_env
    from agentrl.envs.data import load_rows

    torch.manual_seed(seed)
    torch.set_num_threads(os.cpu_count() or 1)
    out.mkdir(parents=True, exist_ok=True)
    recipe = load_recipe(ROOT / recipe_path)
    base = grpo_config_kwargs(recipe, dtype)
    tokenizer = AutoTokenizer.from_pretrained(sft, padding_side="left")
    model = AutoModelForCausalLM.from_pretrained(sft, dtype=torch.float32)  # bfloat16: mixed precision, float32 weights (bf16=True)
    rows = load_rows(recipe.data.source, split=recipe.data.split, fields=recipe.data.fields or None, limit=recipe.data.limit,
                     seed=seed)  # agentrl's rows with seed=s, read as its controller reads them
    env = make_env(recipe.env.id, **recipe.env.kwargs)
    dataset = Dataset.from_list([{"prompt": env.unwrapped.initial_messages(r)} for r in rows])
    stops = turn_stops(tokenizer, tuple(recipe.rollout.stop))
    stop_ids = list(stops.eos_ids)

    config = GRPOConfig(
        output_dir=str(out / "trainer"),
        max_steps=steps,
        **base,
        generation_kwargs={"eos_token_id": stop_ids, "use_cache": True},
        seed=seed,
        data_seed=seed,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
    )
    rollout = CalcRollout(recipe, tokenizer, rows, stops.strings)
    rollout.samples_path = out / "samples.jsonl"
    rollout.samples_path.unlink(missing_ok=True)
    clock: list[dict[str, Any]] = [{"step": 0, "train_s": 0.0, "path": sft, "generate_s": 0.0, "env_s": 0.0}]
    per_step: list[dict[str, Any]] = []
    train_logs: list[dict[str, Any]] = []

    class Clock(TrainerCallback):
        start = 0.0
        saving = 0.0

        def on_train_begin(self, a, state, control, **kw):
            self.start = time.monotonic()

        def on_log(self, a, state, control, logs=None, **kw):
            if logs:
                train_logs.append({"step": state.global_step, **{k: v for k, v in logs.items() if isinstance(v, (int, float))}})

        def on_step_end(self, a, state, control, model=None, **kw):
            step = state.global_step
            at = {"step": step, "train_s": time.monotonic() - self.start - self.saving,
                  "generate_s": rollout.generate_s, "env_s": rollout.env_s}
            per_step.append(at)
            if step % save_every and step != steps:
                return
            t0 = time.monotonic()
            path = out / f"ckpt-{step}"
            trainer.model.save_pretrained(path)
            tokenizer.save_pretrained(path)
            self.saving += time.monotonic() - t0
            clock.append({**at, "path": str(path)})
            print(f"checkpoint {path}: step {step}, {at['train_s']:.1f} s of training", flush=True)

    trainer = GRPOTrainer(model=model, reward_funcs=env_reward, args=config, train_dataset=dataset,
                          processing_class=tokenizer, rollout_func=rollout, callbacks=[Clock()])
    # A single-token stop (the tiny tokenizer's `</code>`) ends a turn: TRL's completion masking
    # must treat it as an end like EOS. Multi-token stops (SmolLM2's): HF's stop-string criterion.
    trainer.eos_token_ids = stop_ids
    stop_on_strings(trainer.accelerator.unwrap_model(trainer.model_wrapped), tokenizer, stops.strings)
    print(f"TRL: {os.cpu_count()} torch threads, {dtype}{' (bf16=True)' if base['bf16'] else ''}, KV cache on, no gradient "
          f"checkpointing; turn ends: ids {stop_ids}, strings {list(stops.strings)}", flush=True)
    try:
        trainer.train()
    finally:
        rollout.close()
    (out / "trl_clock.json").write_text(json.dumps(clock, indent=1))
    (out / "trl_steps.jsonl").write_text("".join(json.dumps(r) + "\n" for r in per_step))
    (out / "trl_logs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in train_logs))


# ------------------------------------------------------------------ running the two sides


def _bench_path(seed_dir: Path, side: str) -> Path:
    """Where the record of ``side``'s finished run of a seed lies (``<seed_dir>/<side>.bench.json``)."""
    return seed_dir / f"{side.lower()}.bench.json"


def run_trl_child(args: argparse.Namespace, seed: int, out: Path) -> float:
    """Run TRL's training for ``seed`` in a child process (this script with ``--trl-child``), its
    console into ``OUT.log``; return its wall-clock seconds, process start to exit."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--trl-child", str(out), "--seed", str(seed), "--recipe", args.recipe,
           "--dtype", args.dtype, "--steps", str(args.steps), "--save-every", str(args.save_every), "--sft", str(ROOT / args.sft)]
    out.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    with open(f"{out}.log", "w") as log:
        rc = subprocess.run(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, timeout=3 * 3600, check=False).returncode
    if rc:
        raise SystemExit(f"{' '.join(cmd)} failed ({rc}); see {out}.log")
    return time.monotonic() - t0


def dtype_overrides(args: argparse.Namespace) -> list[str]:
    """``model.dtype`` for agentrl's runs and evaluations: the dtype this script resolved
    (``args.dtype``) when the recipe asks for ``"auto"``, so both sides and every evaluation use
    the one TRL trains in; nothing when the recipe names a dtype (it is the same)."""
    return [f'model.dtype="{args.dtype}"'] if args.recipe_dtype == "auto" else []


def agentrl_overrides(args: argparse.Namespace, seed: int) -> list[str]:
    """The ``--set`` values of agentrl's run for ``seed``: the seed, the SFT checkpoint with no SFT
    stage, ``--steps`` steps, an evaluation every ``--save-every`` steps (none with
    ``--no-eval``), the dtype (:func:`dtype_overrides`) and ``learner.max_degenerate_steps=0``:
    agentrl trains every step, as TRL does, even when every group of a step has equal rewards
    (SmolLM2 solves most training prompts after a few steps; the recipe's default of 5 would end
    the run early, as a success or an error, with fewer episodes than TRL's; a run that finishes
    under the default trains the same either way)."""
    evals = ["eval.limit=0", "eval.every_steps=0"] if args.no_eval else [f"eval.every_steps={args.save_every}"]
    return [f"seed={seed}", f'model.path="{ROOT / args.sft}"', "sft.steps=0", f"learner.max_steps={args.steps}", *evals,
            "learner.max_degenerate_steps=0", *dtype_overrides(args)]


def run_agentrl(args: argparse.Namespace, seed: int, out: Path) -> float:
    """Run ``agentrl train <--recipe>`` with ``seed`` (:func:`agentrl_overrides`) into ``out``;
    return its wall-clock seconds (:func:`_measure.agentrl_train`)."""
    return agentrl_train(args.recipe, out, agentrl_overrides(args, seed), timeout_s=3 * 3600)


def ensure_run(args: argparse.Namespace, side: str, seed: int, seed_dir: Path, first: bool) -> bool:
    """Run ``side`` for ``seed`` into ``seed_dir/<side>`` unless ``--reuse`` finds it finished;
    record its whole command's seconds and the 1/5/15-minute load averages before and after in
    ``<seed_dir>/<side>.bench.json`` (written only on success). True when it ran now."""
    bench = _bench_path(seed_dir, side)
    settings = {"steps": args.steps, "save_every": args.save_every, "no_eval": args.no_eval, "sft": args.sft,
                "recipe": args.recipe, "dtype": args.dtype}
    if args.reuse and bench.is_file():
        recorded = json.loads(bench.read_text())
        differ = {k: (recorded.get(k, LEGACY_SETTINGS.get(k)), v) for k, v in settings.items()
                  if recorded.get(k, LEGACY_SETTINGS.get(k)) != v}
        if differ:
            raise SystemExit(f"--reuse: {bench} was run with other settings (recorded, asked): {differ}; "
                             "give the same settings, another --out, or drop --reuse")
        print(f"seed {seed} {side}: reusing the finished run in {seed_dir / side.lower()}", flush=True)
        return False
    bench.unlink(missing_ok=True)
    print(f"seed {seed} {side}: training -> {seed_dir / side.lower()}", flush=True)
    before, started = os.getloadavg(), time.time()
    run = run_trl_child if side == "TRL" else run_agentrl
    seconds = run(args, seed, seed_dir / side.lower())
    after = os.getloadavg()
    bench.write_text(json.dumps({"command_s": seconds, "load_before": before, "load_after": after, "first": first,
                                 "started": started, "ended": time.time(), **settings}, indent=1))
    print(f"seed {seed} {side}: {seconds:.0f} s (load {before[0]:.1f} -> {after[0]:.1f})", flush=True)
    return True


def evaluate(args: argparse.Namespace, path: str, run_dir: Path, seed: int, reuse: bool) -> dict[str, Any]:
    """Held-out accuracy of the checkpoint ``path`` by agentrl's evaluator (``args.recipe`` with
    ``mode="eval"`` and ``seed``: the recipe's ``eval.limit`` eval-split problems of that seed, at
    its ``eval.temperature``, every turn's sampling seed derived from ``seed``, in the dtype both
    sides train in): the eval record of its metrics.jsonl. ``reuse``: a finished evaluation (its
    ``summary.json``) is read, not run again."""
    if not (reuse and (run_dir / "summary.json").is_file()):
        if run_dir.is_dir():  # an earlier evaluation of an earlier checkpoint: its records must not mix with this one's
            shutil.rmtree(run_dir)
        agentrl_train(args.recipe, run_dir, ['mode="eval"', f"seed={seed}", f'model.path="{path}"', "sft.steps=0", *dtype_overrides(args)],
                      timeout_s=1800, fresh=False)
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    evals = [r for r in records if r.get("kind") == "eval"]
    if not evals:
        raise SystemExit(f"{run_dir}: no evaluation record in metrics.jsonl")
    return evals[-1]


def trl_evaluations(args: argparse.Namespace, seed: int, seed_dir: Path, reuse: bool) -> dict[int, float]:
    """Held-out accuracy of every TRL checkpoint of ``seed`` (step -> accuracy), each by
    :func:`evaluate` in ``seed_dir/trl_eval/step-<step>``."""
    clock = json.loads((seed_dir / "trl" / "trl_clock.json").read_text())
    out: dict[int, float] = {}
    for c in clock:
        rec = evaluate(args, c["path"], seed_dir / "trl_eval" / f"step-{c['step']}", seed, reuse)
        out[int(c["step"])] = float(rec["accuracy"])
        print(f"seed {seed} TRL step {c['step']}: {c['train_s']:.0f} s, held-out accuracy {rec['accuracy']:.3f}", flush=True)
    return out


# ------------------------------------------------------------------ what a run is, read back


@dataclass
class Run:
    """One side's training run for one seed, as the report reads it."""

    seed: int
    side: str
    """Which side: "TRL" or "agentrl"."""
    steps: int
    """Optimiser steps trained, ``episodes_per_step`` episodes each."""
    rl_s: float
    """RL-loop seconds (the module docstring's "Clocks")."""
    command_s: float
    """The whole command's seconds, process start to exit."""
    episodes_per_step: int
    """Episodes per optimiser step (the recipe's ``learner.batch_size``, both sides)."""
    eval_s: float = 0.0
    """Of ``command_s``, seconds spent in evaluations (agentrl's in-run ones; 0 for TRL)."""
    curve: list[dict[str, float]] = field(default_factory=list)
    """``[{step, s, accuracy}]``: held-out accuracy at each evaluated checkpoint, ``s`` its RL-loop seconds."""
    load_before: float = 0.0
    """1-minute load average just before the run."""
    load_after: float = 0.0
    """1-minute load average just after it."""
    first: bool = False
    """Whether this side ran first of its seed."""
    split: dict[str, float] = field(default_factory=dict)
    """Time per step, label -> median seconds (or a fraction, for labels ending in "busy")."""
    span: tuple[float, float] = (0.0, 0.0)
    """When the run started and ended (``time.time()``; 0 in records older than this field)."""

    @property
    def samples_per_s(self) -> float:
        """Episodes trained per RL-loop second."""
        return self.episodes_per_step * self.steps / self.rl_s

    @property
    def final_accuracy(self) -> float | None:
        """Held-out accuracy at the last evaluated checkpoint (None without evaluations)."""
        return self.curve[-1]["accuracy"] if self.curve else None


def _records(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]


def _deltas(cumulative: list[dict[str, Any]], key: str) -> list[float]:
    """Per-step differences of the cumulative ``key`` over ``cumulative`` (records in step order, from 0)."""
    values = [0.0] + [float(r[key]) for r in cumulative]
    return [b - a for a, b in zip(values, values[1:])]


def trl_split(per_step: list[dict[str, Any]]) -> dict[str, float]:
    """Median seconds per step of TRL's step, its HF ``generate``, its environment/sandbox and the
    rest, from ``trl_steps.jsonl``'s cumulative records."""
    if not per_step:
        return {}
    step, gen, env = _deltas(per_step, "train_s"), _deltas(per_step, "generate_s"), _deltas(per_step, "env_s")
    return {"step": median(step), "HF generate": median(gen), "environment (sandbox)": median(env),
            "rest (loss, backward, optimiser, TRL)": median(s - g - e for s, g, e in zip(step, gen, env))}


AGENTRL_STEP_FIELDS = (("train_s", "learner train"), ("step_forward_backward_s", "of it forward+backward"),
                       ("step_optimizer_s", "of it optimiser"), ("step_transfer_s", "batch transfer"),
                       ("publish_s", "publish weights"), ("update_stall_s", "generator update stall"),
                       ("generator_sleep_s", "handover (generator sleep, colocated)"),
                       ("episode_generate_s_mean", "an episode's wait for generation (episodes overlap)"),
                       ("episode_env_s_mean", "an episode's wait for the environment (sandbox)"))
"""The per-step timing fields agentrl's loop writes in its step records (loop.py ``_train``,
learner.py ``train_step``), with their labels; a field absent from every record is left out."""


def agentrl_split(records: list[dict[str, Any]]) -> dict[str, float]:
    """Median seconds per step from agentrl's step records: the interval between step records
    (evaluations inside it taken out), each of :data:`AGENTRL_STEP_FIELDS` present, and the
    interval less ``learner_busy_s`` (the loop's training, transfer and publishing: what is left
    is the time the step waited for its episodes, generation and sandbox; each episode's own
    waits for the two are ``episode_generate_s_mean`` and ``episode_env_s_mean``, but episodes
    run concurrently, so those do not add up to it); the generator's and the learner's busy fractions of the loop from the
    ``utilisation`` record."""
    steps = [r for r in records if r.get("kind") == "step"]
    if not steps:
        return {}
    evals = [r for r in records if r.get("kind") == "eval"]
    start = next((r["time"] for r in records if r.get("loop_start")), steps[0]["time"])
    times = [start] + [r["time"] for r in steps]
    intervals = [b - a - sum(e.get("eval_s", 0.0) for e in evals if a < e["time"] <= b) for a, b in zip(times, times[1:])]
    out = {"step": median(intervals)}
    for key, label in AGENTRL_STEP_FIELDS:
        values = [float(r[key]) for r in steps if key in r]
        if values:
            out[label] = median(values)
    if all("learner_busy_s" in r for r in steps):  # the loop's training + publishing; the rest waited for episodes
        out["rest: episodes (generation, sandbox), waiting"] = median(i - float(r["learner_busy_s"]) for i, r in zip(intervals, steps))
    util = next((r for r in reversed(records) if r.get("kind") == "utilisation"), None)
    if util is not None:
        out["generator busy"] = float(util.get("generator_busy_fraction", float("nan")))
        out["learner busy"] = float(util.get("learner_busy_fraction", float("nan")))
    return out


def agentrl_rl_s(records: list[dict[str, Any]]) -> tuple[float, int]:
    """agentrl's RL-loop seconds (the ``utilisation`` record's ``rl_wall_s`` minus the evaluations
    logged inside the loop) and its last step."""
    util = next((r for r in reversed(records) if r.get("kind") == "utilisation"), None)
    steps = [r for r in records if r.get("kind") == "step"]
    if util is None or not steps:
        raise SystemExit("agentrl's metrics.jsonl has no utilisation record or no step: did the run finish?")
    start = next(r["time"] for r in records if r.get("loop_start"))
    inside = sum(r.get("eval_s", 0.0) for r in records if r.get("kind") == "eval" and start < r["time"] <= util["time"])
    return float(util["rl_wall_s"]) - inside, int(steps[-1]["step"])


def read_trl(seed: int, seed_dir: Path, accuracy: dict[int, float], episodes_per_step: int) -> Run:
    """TRL's run of ``seed`` read back from ``seed_dir`` (its clock, its per-step clock and its
    bench record), with the held-out ``accuracy`` of its checkpoints (step -> accuracy; empty
    without evaluations); ``episodes_per_step`` episodes per step."""
    out = seed_dir / "trl"
    bench = json.loads(_bench_path(seed_dir, "TRL").read_text())
    clock = json.loads((out / "trl_clock.json").read_text())
    per_step = [json.loads(x) for x in (out / "trl_steps.jsonl").read_text().splitlines() if x.strip()]
    curve = [{"step": c["step"], "s": c["train_s"], "accuracy": accuracy[c["step"]]} for c in clock if c["step"] in accuracy]
    return Run(seed=seed, side="TRL", steps=int(clock[-1]["step"]), rl_s=float(clock[-1]["train_s"]), command_s=bench["command_s"],
               episodes_per_step=episodes_per_step, curve=curve, load_before=bench["load_before"][0], load_after=bench["load_after"][0], first=bench["first"],
               split=trl_split(per_step), span=(bench.get("started", 0.0), bench.get("ended", 0.0)))


def read_agentrl(seed: int, seed_dir: Path, episodes_per_step: int) -> Run:
    """agentrl's run of ``seed`` read back from ``seed_dir/agentrl`` and its bench record
    (``episodes_per_step`` episodes per step)."""
    run_dir = seed_dir / "agentrl"
    bench = json.loads(_bench_path(seed_dir, "agentrl").read_text())
    records = _records(run_dir)
    rl_s, steps = agentrl_rl_s(records)
    curve = [{"step": p["version"], "s": p["rl_s"], "accuracy": p["accuracy"]} for p in eval_curve(str(run_dir))] \
        if any(r.get("kind") == "eval" for r in records) else []
    eval_s = sum(r.get("eval_s", 0.0) for r in records if r.get("kind") == "eval")
    return Run(seed=seed, side="agentrl", steps=steps, rl_s=rl_s, command_s=bench["command_s"], episodes_per_step=episodes_per_step,
               eval_s=eval_s, curve=curve,
               load_before=bench["load_before"][0], load_after=bench["load_after"][0], first=bench["first"],
               split=agentrl_split(records), span=(bench.get("started", 0.0), bench.get("ended", 0.0)))


def in_run_checkpoints(run_dir: Path) -> tuple[int, float]:
    """agentrl's in-run checkpoints (its ``checkpoint step_N (X s)`` events, ``(X s; written in the
    background, ...)`` with ``checkpoint.background``): how many, and the seconds they held the
    loop together (inside its RL-loop clock)."""
    import re

    pattern = re.compile(r"^checkpoint step_\d+ \(([\d.]+) s(?:\)|;.*\))$")
    seconds = [float(m.group(1)) for r in _records(run_dir) if r.get("kind") == "event" and (m := pattern.match(r.get("message", "")))]
    return len(seconds), sum(seconds)


# ------------------------------------------------------------------ aggregation (pure)


def seconds_to(curve: list[dict[str, float]], threshold: float) -> float | None:
    """RL-loop seconds of the first evaluation of ``curve`` at or above ``threshold``, or None."""
    return next((p["s"] for p in curve if p["accuracy"] >= threshold - 1e-9), None)


def ratios(runs: list[Run]) -> dict[int, float]:
    """Per seed with both sides: agentrl's samples/s divided by TRL's."""
    by = {(r.seed, r.side): r for r in runs}
    seeds = sorted({r.seed for r in runs})
    return {s: by[s, "agentrl"].samples_per_s / by[s, "TRL"].samples_per_s for s in seeds if (s, "agentrl") in by and (s, "TRL") in by}


@dataclass
class SideSummary:
    """One side's medians over its seeds."""

    side: str
    seeds: int
    samples_per_s: float
    command_s: float
    final_accuracy: float | None
    """None without evaluations."""
    to_threshold_s: float | None
    """Median RL-loop seconds to the threshold over the seeds that reached it; None if none did."""
    reached: int
    """Seeds whose curve reached the threshold."""


def summarise(runs: list[Run], side: str, threshold: float) -> SideSummary:
    """``side``'s medians over its runs among ``runs``."""
    mine = [r for r in runs if r.side == side]
    if not mine:
        raise ValueError(f"no {side} run to summarise")
    finals = [r.final_accuracy for r in mine if r.final_accuracy is not None]
    hits = [t for t in (seconds_to(r.curve, threshold) for r in mine) if t is not None]
    return SideSummary(side=side, seeds=len(mine), samples_per_s=median(r.samples_per_s for r in mine),
                       command_s=median(r.command_s for r in mine), final_accuracy=median(finals) if finals else None,
                       to_threshold_s=median(hits) if hits else None, reached=len(hits))


@dataclass
class Race:
    """One seed's race to TRL's final held-out accuracy."""

    seed: int
    target: float
    """TRL's accuracy at its last checkpoint."""
    trl_s: float
    """TRL's RL-loop seconds at its first checkpoint at or above ``target``."""
    agentrl_s: float | None
    """agentrl's RL-loop seconds at its first evaluation at or above ``target`` (None: never)."""
    rule: GoalRule = TINY_GOAL
    """The goal whose "sooner" applies (its ``within`` and ``inclusive``)."""

    @property
    def agentrl_sooner(self) -> bool:
        """agentrl got there within the rule's share of TRL's seconds (``<`` or ``<=``)."""
        if self.agentrl_s is None:
            return False
        limit = self.rule.within * self.trl_s
        return self.agentrl_s <= limit + 1e-9 if self.rule.inclusive else self.agentrl_s < limit


@dataclass
class Goal:
    """A :class:`GoalRule` checked on a set of runs."""

    rule: GoalRule
    ratios: dict[int, float]
    median_ratio: float
    speed_met: bool
    races: list[Race]
    accuracy_met: bool | None
    """None when no seed has evaluations on both sides."""

    @property
    def met(self) -> bool | None:
        """Both parts met (None when the accuracy part could not be measured)."""
        if self.accuracy_met is None:
            return None
        return self.speed_met and self.accuracy_met


def check_goal(runs: list[Run], rule: GoalRule = TINY_GOAL) -> Goal:
    """``rule`` on ``runs``: the median over seeds of agentrl/TRL samples/s at least
    ``rule.speedup``, and, in more than half of the seeds with evaluations on both sides, agentrl's
    first evaluation at or above TRL's final accuracy at fewer RL-loop seconds than TRL's first
    (issue 33), or at no more than ``rule.within`` of them (issue 34: 2/3)."""
    per_seed = ratios(runs)
    if not per_seed:
        raise ValueError("no seed has both a TRL and an agentrl run")
    by = {(r.seed, r.side): r for r in runs}
    races = []
    for seed in sorted(per_seed):
        trl, ours = by[seed, "TRL"], by[seed, "agentrl"]
        if trl.curve and ours.curve:
            target = trl.curve[-1]["accuracy"]
            trl_s = seconds_to(trl.curve, target)
            assert trl_s is not None  # TRL's last checkpoint is at the target
            races.append(Race(seed=seed, target=target, trl_s=trl_s, agentrl_s=seconds_to(ours.curve, target), rule=rule))
    med = median(per_seed.values())
    accuracy_met = (2 * sum(r.agentrl_sooner for r in races) > len(races)) if races else None
    return Goal(rule=rule, ratios=per_seed, median_ratio=med, speed_met=med >= rule.speedup, races=races, accuracy_met=accuracy_met)


def mean_curves(runs: list[Run], side: str) -> list[dict[str, float]]:
    """``side``'s held-out curve averaged over its seeds, checkpoint by checkpoint (steps every
    run of the side evaluated): ``[{step, s, accuracy}]`` with mean seconds and mean accuracy."""
    curves = [r.curve for r in runs if r.side == side and r.curve]
    if not curves:
        return []
    common = sorted(set.intersection(*({int(p["step"]) for p in c} for c in curves)))
    at = [{int(p["step"]): p for p in c} for c in curves]
    return [{"step": s, "s": mean(c[s]["s"] for c in at), "accuracy": mean(c[s]["accuracy"] for c in at)} for s in common]


# ------------------------------------------------------------------ report


def _acc(x: float | None) -> str:
    return "–" if x is None else f"{x:.3f}"


def _secs(x: float | None) -> str:
    return "not reached" if x is None else f"{x:.0f}"


def run_table(runs: list[Run], threshold: float) -> list[str]:
    """One row per seed and side."""
    lines = [f"| seed | side | ran | samples/s (RL loop) | RL loop s | whole command s (of it evaluation) | final held-out accuracy "
             f"| RL s to >= {threshold:.2f} | load avg (1 min) before -> after |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in sorted(runs, key=lambda r: (r.seed, not r.first)):
        lines.append(f"| {r.seed} | {r.side} | {'first' if r.first else 'second'} | {r.samples_per_s:.2f} | {r.rl_s:.0f} "
                     f"| {r.command_s:.0f} ({r.eval_s:.0f}) | {_acc(r.final_accuracy)} | {_secs(seconds_to(r.curve, threshold))} "
                     f"| {r.load_before:.1f} -> {r.load_after:.1f} |")
    return lines


def median_table(runs: list[Run], threshold: float) -> list[str]:
    """Per side, the medians over seeds."""
    lines = [f"| side (median of {len({r.seed for r in runs})} seeds) | samples/s (RL loop) | whole command s | final held-out accuracy "
             f"| RL s to >= {threshold:.2f} |", "| --- | --- | --- | --- | --- |"]
    for side in SIDES:
        if not any(r.side == side for r in runs):
            continue
        m = summarise(runs, side, threshold)
        hit = f"{m.to_threshold_s:.0f}" if m.to_threshold_s is not None else "not reached"
        if m.final_accuracy is not None and m.reached < m.seeds:
            hit += f" (reached in {m.reached} of {m.seeds} seeds)"
        lines.append(f"| {side} | {m.samples_per_s:.2f} | {m.command_s:.0f} | {_acc(m.final_accuracy)} | {hit if m.final_accuracy is not None else '–'} |")
    return lines


def goal_lines(goal: Goal) -> list[str]:
    """The goal stated plainly, with its numbers."""
    verdict = {True: "**met**", False: "**not met**", None: "**not decided** (no held-out evaluations: --no-eval)"}[goal.met]
    per_seed = ", ".join(f"seed {s} {x:.2f}x" for s, x in goal.ratios.items())
    rule = goal.rule
    lines = [f"- agentrl/TRL samples per second (RL loop): {per_seed}; median **{goal.median_ratio:.2f}x** "
             f"({'at least' if goal.speed_met else 'below'} {rule.speedup}x)"]
    if goal.races:
        wins = sum(r.agentrl_sooner for r in goal.races)
        each = "; ".join(f"seed {r.seed}: TRL's final {r.target:.3f} reached by TRL at {r.trl_s:.0f} s, by agentrl "
                         + (f"at {r.agentrl_s:.0f} s" if r.agentrl_s is not None else "never") for r in goal.races)
        soon = "sooner" if rule.within == 1.0 and not rule.inclusive else \
            f"within {'<=' if rule.inclusive else '<'} {rule.share} of TRL's seconds"
        lines.append(f"- reaching TRL's final held-out accuracy (RL-loop seconds, first evaluation at or above it): {each} — agentrl "
                     f"{soon} in {wins} of {len(goal.races)} seeds ({'more' if goal.accuracy_met else 'not more'} than half)")
    return [f"Goal (issue {rule.issue}): \"{rule.statement()}\" — {verdict}.", *lines]


def split_lines(runs: list[Run], seed_dirs: dict[int, Path]) -> list[str]:
    """Time per step of each run (medians over its steps)."""
    lines = []
    for r in sorted(runs, key=lambda r: (r.seed, r.side)):
        parts = ", ".join(f"{k} {v:.0%}" if k.endswith("busy") else f"{k} {v:.2f} s" for k, v in r.split.items())
        extra = ""
        if r.side == "agentrl":
            n, secs = in_run_checkpoints(seed_dirs[r.seed] / "agentrl")
            extra = f"; {n} in-run checkpoints, {secs:.1f} s together (inside its RL-loop clock)"
        lines.append(f"- seed {r.seed} {r.side}: {parts}{extra}")
    return lines


def curve_table(runs: list[Run]) -> list[str]:
    """Held-out accuracy per checkpoint step, each side's mean over its seeds."""
    lines = ["| side | step | RL s (mean) | held-out accuracy (mean) |", "| --- | --- | --- | --- |"]
    for side in SIDES:
        for p in mean_curves(runs, side):
            lines.append(f"| {side} | {p['step']} | {p['s']:.0f} | {p['accuracy']:.3f} |")
    return lines if len(lines) > 2 else []


def step0_check(runs: list[Run]) -> str:
    """The step-0 evaluations (the SFT checkpoint) of both sides, per seed: the same problems and
    sampling seeds on the same weights."""
    by = {(r.seed, r.side): r for r in runs if r.curve and r.curve[0]["step"] == 0}
    pairs = [f"seed {s}: TRL {by[s, 'TRL'].curve[0]['accuracy']:.3f}, agentrl {by[s, 'agentrl'].curve[0]['accuracy']:.3f}"
             for s in sorted({r.seed for r in runs}) if (s, "TRL") in by and (s, "agentrl") in by]
    return "- step 0 (the SFT checkpoint, scored by each side's evaluator run with the seed's problems): " + "; ".join(pairs) if pairs else ""


def trained_when(runs: list[Run]) -> str:
    """``, trained <date> <start>–<end>`` (local time) from the runs' recorded spans; "" without them."""
    spans = [r.span for r in runs if r.span[0] > 0]
    if not spans:
        return ""
    first, last = min(a for a, _ in spans), max(b for _, b in spans)
    return f", trained {time.strftime('%Y-%m-%d %H:%M', time.localtime(first))}–{time.strftime('%H:%M', time.localtime(last))}"


def intro(peer: PeerSettings, args: argparse.Namespace, trl_version: str, trained: str = "") -> str:
    """The block's paragraph on what ran: seeds, steps, the recipe's settings (``peer``), the
    dtype, the evaluation, the clocks. ``args``: seeds, sft, steps, save_every, out, recipe,
    dtype; ``trained``: :func:`trained_when`'s text."""
    kl = "no KL" if not peer.kl_coef else f"KL {peer.kl_coef:g}"
    stops = ", ".join(f"`{x}`" for x in peer.stops) or "none"
    return (f"Seeds {args.seeds}, each: TRL and agentrl on `{args.recipe}` (`{peer.name}`) from `{args.sft}`, {args.steps} optimiser "
            f"steps of {peer.episodes_per_step} episodes ({peer.prompts_per_step} prompts x {peer.group_size}), run one after the other "
            f"(the first side alternating by seed), each timed as its own process; {peer.env} with the Python tool (up to "
            f"{peer.max_turns} turns, {peer.max_new_tokens} new tokens a turn, a turn ends at {stops} or EOS), training rows "
            f"{peer.data}, temperature {peer.temperature:g}, lr {peer.lr:g} constant, {kl}, clip {peer.clip[0]:g}/{peer.clip[1]:g}, "
            f"{args.dtype} on both sides; held-out accuracy by agentrl's evaluator on the seed's {peer.eval_limit} problems at "
            f"temperature {peer.eval_temperature:g} every {args.save_every} steps. TRL {trl_version}: `GRPOTrainer` with batched HF "
            f"`generate` (KV cache) on the CPU with all threads and a `rollout_func` that runs agentrl's environment between turns. "
            f"RL loop s: training only (start-up, evaluation and TRL's checkpoint saving excluded); whole command: process start to "
            f"exit (agentrl's includes its evaluations, in brackets). The script's docstring lists every difference and every clock. "
            f"Runs in `{args.out}`{trained}.")


def report(args: argparse.Namespace, runs: list[Run], seed_dirs: dict[int, Path], started: float) -> str:
    """The whole block: header, setup, tables, goal, time per step, curve."""
    import trl

    lines = [run_header(started), "", intro(args.peer, args, trl.__version__, trained_when(runs)), "",
             *run_table(runs, args.threshold), "", *median_table(runs, args.threshold), ""]
    try:
        lines += [*goal_lines(check_goal(runs, args.peer.goal)), ""]
    except ValueError as exc:
        lines += [f"Goal (issue {args.peer.goal.issue}): not checked: {exc}", ""]
    lines += ["Time per step (medians over the steps). agentrl's 'rest' is the step interval less the loop's training, transfer and "
              "publishing (colocated on this machine: the episodes' phase, generation and sandbox together); an episode's own waits "
              "for generation and for the sandbox are given beside it (episodes run concurrently, so they do not add up to the "
              "phase); its utilisation record gives the generator's and the learner's busy fractions of the loop:",
              "", *split_lines(runs, seed_dirs)]
    check = step0_check(runs)
    curve = curve_table(runs)
    if curve:
        lines += ["", "Held-out accuracy per checkpoint step (mean over seeds):", "", *curve]
    if check:
        lines += ["", check]
    return "\n".join(lines)


# ------------------------------------------------------------------ main


def parse_seeds(text: str) -> list[int]:
    """``"0,1,2"`` -> ``[0, 1, 2]``; raises ValueError on a non-integer or a repeated seed."""
    seeds = [int(s) for s in text.split(",") if s.strip()]
    if not seeds or len(set(seeds)) != len(seeds):
        raise ValueError(f"--seeds {text!r}: give distinct integers, comma-separated")
    return seeds


def order(index: int) -> tuple[str, str]:
    """Which side runs first for the ``index``-th seed listed: TRL for even, agentrl for odd."""
    return SIDES if index % 2 == 0 else SIDES[::-1]


def run_seed(args: argparse.Namespace, index: int, seed: int, seed_dir: Path) -> list[Run]:
    """Both sides of ``seed`` (``index``: its place in ``--seeds``, which picks the first side),
    then the held-out evaluations of TRL's checkpoints; the two runs read back."""
    ran: dict[str, bool] = {}
    for i, side in enumerate(order(index)):
        ran[side] = ensure_run(args, side, seed, seed_dir, first=i == 0)
    accuracy = {} if args.no_eval else trl_evaluations(args, seed, seed_dir, reuse=args.reuse and not ran["TRL"])
    n = args.peer.episodes_per_step
    return [read_trl(seed, seed_dir, accuracy, n), read_agentrl(seed, seed_dir, n)]


def sft_command(recipe: str, sft: str) -> str:
    """The command that makes the SFT checkpoint ``sft`` (a run directory's ``sft/`` folder) with
    ``recipe``'s SFT stage only (``mode="sft"``: the stage runs and the run ends before RL)."""
    run_dir = str(Path(sft).parent)
    return f"flock /tmp/agentrl-heavy.lock .venv/bin/agentrl train {recipe} --set mode=sft --set run_dir={run_dir}"


def fill_defaults(args: argparse.Namespace, recipe: Any) -> None:
    """The options left out, from ``recipe``: ``--steps`` (``learner.max_steps``),
    ``--save-every`` (20 for tiny_calc, as before; else ``eval.every_steps``, or ``--steps``),
    ``--sft`` (``runs/<name>/sft``), ``--out`` (``runs/bench_trl_peer`` for tiny_calc, else
    ``runs/bench_trl_peer_<name>``), ``--dtype`` (:func:`resolve_dtype`; a TRL child is given its
    parent's); and ``args.recipe_dtype`` (the recipe's own ``model.dtype``)."""
    name = recipe.name
    if args.steps is None:
        args.steps = recipe.learner.max_steps
    if args.save_every is None:
        args.save_every = 20 if name == "tiny_calc" else (recipe.eval.every_steps or args.steps)
    if args.sft is None:
        args.sft = f"runs/{name}/sft"
    if args.out is None:
        args.out = "runs/bench_trl_peer" if name == "tiny_calc" else f"runs/bench_trl_peer_{name}"
    if args.dtype is None:
        args.dtype = resolve_dtype(recipe)
    args.recipe_dtype = recipe.model.dtype


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", default="0,1,2", help="comma-separated seeds; both sides run once per seed, interleaved")
    ap.add_argument("--recipe", default=RECIPE, help="the recipe whose task and settings both sides use (relative to the repository)")
    ap.add_argument("--steps", type=int, default=None, help="optimiser steps per run (default: the recipe's learner.max_steps)")
    ap.add_argument("--save-every", type=int, default=None,
                    help="checkpoint (and evaluate) every this many steps (default: 20 for tiny_calc, else the recipe's eval.every_steps)")
    ap.add_argument("--sft", default=None, help="the SFT checkpoint both sides start from (default: runs/<recipe name>/sft)")
    ap.add_argument("--threshold", type=float, default=0.6, help="held-out accuracy for the 'RL s to >= threshold' column")
    ap.add_argument("--out", default=None, help="default: runs/bench_trl_peer (tiny_calc), runs/bench_trl_peer_<recipe name> (others)")
    ap.add_argument("--no-eval", action="store_true", help="train only, no held-out evaluation (smoke test)")
    ap.add_argument("--reuse", action="store_true", help="read finished runs and evaluations under --out instead of running them again")
    ap.add_argument("--write", action="store_true",
                    help="write the results into benchmarks/RESULTS.md (block trl_peer for tiny_calc, 'trl_peer <recipe name>' for others)")
    ap.add_argument("--trl-child", default=None, metavar="DIR", help=argparse.SUPPRESS)  # internal: TRL's training only, into DIR
    ap.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)  # with --trl-child
    ap.add_argument("--dtype", default=None, help=argparse.SUPPRESS)  # with --trl-child: the dtype the parent resolved
    args = ap.parse_args()
    from agentrl.config import load_recipe

    recipe = load_recipe(ROOT / args.recipe)
    try:
        args.peer = peer_settings(recipe)
    except ValueError as exc:
        ap.error(str(exc))
    fill_defaults(args, recipe)
    if args.trl_child:
        train_trl(args.recipe, args.dtype, args.steps, args.save_every, args.sft, args.seed, Path(args.trl_child))
        return
    try:
        seeds = parse_seeds(args.seeds)
    except ValueError as exc:
        ap.error(str(exc))
    if not (ROOT / args.sft / "config.json").is_file():
        raise SystemExit(f"no SFT checkpoint at {ROOT / args.sft}: make it first with the recipe's SFT stage:\n  "
                         f"{sft_command(args.recipe, args.sft)}")
    key = result_key(args.peer.name, args.dtype)
    print(f"{args.recipe}: {args.peer.episodes_per_step} episodes a step, {args.steps} steps, {args.dtype}; "
          f"results block {key!r}", flush=True)
    started = time.time()
    out = ROOT / args.out
    seed_dirs = {s: out / f"seed{s}" for s in seeds}
    runs: list[Run] = []
    failed: list[str] = []
    for index, seed in enumerate(seeds):
        try:
            runs += run_seed(args, index, seed, seed_dirs[seed])
        except SystemExit as exc:  # one seed's failure does not throw away the others' runs
            failed.append(f"seed {seed}: {exc}")
            print(f"seed {seed} FAILED: {exc}", flush=True)
    if failed:
        raise SystemExit(f"not reported: these runs failed (the others are kept under {out}; rerun with --reuse once they are "
                         "fixed):\n  " + "\n  ".join(failed))
    emit(report(args, runs, seed_dirs, started), key, args.write, section="A peer: TRL's GRPOTrainer")


if __name__ == "__main__":
    main()
