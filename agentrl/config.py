"""The recipe: one TOML file describing a whole experiment, validated into typed pydantic models.

``load_recipe(path, overrides)`` reads the TOML file, applies ``--set section.key=value``
overrides and validates. Every failure is a :class:`~agentrl.errors.ConfigError` whose message
names the file, the key path, the value given and what was expected, e.g.::

    recipes/tiny_calc.toml: learner.lr: got 'fast' (str); expected a number

Components never receive the recipe: :mod:`agentrl.engine.wiring` turns its sections into plain
arguments and :mod:`agentrl.engine.assembly` builds the run's parts with them.
Every field has a docstring (pydantic turns attribute docstrings into field descriptions).

The sections live in :mod:`agentrl.recipe` (one module per part of a run); this module joins them
into :class:`Recipe` with the rules that span sections, and re-exports them all.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import ValidationError, model_validator

from agentrl.errors import ConfigError
from agentrl.recipe.model import DataConfig, EnvConfig, ModelConfig, SandboxConfig, TinySpecConfig
from agentrl.recipe.generation import GeneratorConfig, GPU_STARTUP_TIMEOUT_S, RolloutConfig
from agentrl.recipe.training import AlgoConfig, CriticConfig, GROUP_RELATIVE, LearnerConfig, LoraConfig, SftConfig
from agentrl.recipe.run import CheckpointConfig, EvalConfig, EvalSetConfig, PlacementConfig, RayConfig, WandbConfig
from agentrl.recipe.rewards import JudgeConfig, RewardConfig, RewardFunctionConfig, RewardModelConfig
from agentrl.recipe.section import Section

__all__ = [
    "Recipe",
    "ModelConfig",
    "TinySpecConfig",
    "DataConfig",
    "EnvConfig",
    "SandboxConfig",
    "GeneratorConfig",
    "RolloutConfig",
    "LearnerConfig",
    "AlgoConfig",
    "RayConfig",
    "SftConfig",
    "EvalConfig",
    "CheckpointConfig",
    "WandbConfig",
    "RewardConfig",
    "RewardFunctionConfig",
    "JudgeConfig",
    "RewardModelConfig",
    "EvalSetConfig",
    "PlacementConfig",
    "CriticConfig",
    "LoraConfig",
    "GPU_STARTUP_TIMEOUT_S",
    "GROUP_RELATIVE",
    "UNSET",
    "load_recipe",
    "parse_override",
    "validate_recipe",
]


class Recipe(Section):
    """A whole experiment."""

    name: str = "run"
    """Experiment name (used in the default run directory)."""
    mode: Literal["async", "sync", "sft", "eval"] = "async"
    """``async``: generation and training overlap under ``algo.max_staleness``; ``sync``: the
    on-policy baseline (the same machinery with ``max_staleness = 0``); ``sft``: only the
    supervised stage (``[sft]``), no generators; ``eval``: generators and environments only,
    held-out metrics of ``model.path``, nothing trained."""
    seed: int = 0
    """Seed of data order, sampling and initialisation."""
    run_dir: str | None = None
    """Run directory (metrics, weight versions, checkpoints). Default: ``runs/<name>``."""
    model: ModelConfig
    """The model."""
    data: DataConfig = DataConfig()
    """The prompts."""
    env: EnvConfig = EnvConfig()
    """The environment."""
    sandbox: SandboxConfig = SandboxConfig()
    """The code sandbox handed to environments that run code."""
    generator: GeneratorConfig = GeneratorConfig()
    """The vLLM generators."""
    rollout: RolloutConfig = RolloutConfig()
    """Episode playing."""
    learner: LearnerConfig = LearnerConfig()
    """The learner."""
    algo: AlgoConfig = AlgoConfig()
    """The objective."""
    ray: RayConfig = RayConfig()
    """Ray placement."""
    sft: SftConfig = SftConfig()
    """Optional supervised warm-up before RL."""
    eval: EvalConfig = EvalConfig()
    """Held-out evaluation."""
    checkpoint: CheckpointConfig = CheckpointConfig()
    """Checkpoints and resume."""
    placement: PlacementConfig = PlacementConfig()
    """Generation and training on devices of their own, or taking turns on the same ones."""
    lora: LoraConfig | None = None
    """Adapter-only training (absent: full fine-tuning)."""
    critic: CriticConfig | None = None
    """PPO's value model, for ``algo.advantage = "gae"`` (absent: the defaults of ``[critic]``)."""
    wandb: WandbConfig = WandbConfig()
    """Optional Weights & Biases logging."""
    reward: RewardConfig = RewardConfig()
    """The reward: the environment's, optionally with an LLM judge's and a reward model's."""

    @model_validator(mode="after")
    def _check_batch(self) -> "Recipe":
        if self.learner.batch_size % self.rollout.group_size:
            raise ValueError(
                f"learner.batch_size ({self.learner.batch_size}) must be a multiple of "
                f"rollout.group_size ({self.rollout.group_size})"
            )
        return self

    @model_validator(mode="after")
    def _check_lora(self) -> "Recipe":
        lo, g = self.lora, self.generator
        if lo is None:
            return self
        if g.backend == "http":
            raise ValueError('lora: generator.backend = "http" cannot take adapters from the run; use backend = "vllm"')
        if g.weight_sync != "disk":
            raise ValueError(f'lora: adapters go to the generators as small folders; set generator.weight_sync = "disk" (got "{g.weight_sync}")')
        if lo.modules_to_save and self.mode != "sft":
            raise ValueError(f"lora.modules_to_save = {lo.modules_to_save}: vLLM cannot serve adapters that save whole modules; only mode = 'sft' accepts them")
        if lo.max_loras < self.max_staleness + 2:
            raise ValueError(f"lora.max_loras = {lo.max_loras} must be at least max_staleness + 2 = {self.max_staleness + 2} (versions in flight at once)")
        return self

    @model_validator(mode="after")
    def _check_critic(self) -> "Recipe":
        if self.critic is not None and self.algo.advantage != "gae":
            raise ValueError(
                f'critic: the [critic] section trains a value function for algo.advantage = "gae"; this recipe uses '
                f'"{self.algo.advantage}" (set algo.advantage = "gae" or remove [critic])'
            )
        return self

    @model_validator(mode="after")
    def _check_refill(self) -> "Recipe":
        a = self.algo
        if a.dynamic_sampling != "refill":
            return self
        if a.advantage not in GROUP_RELATIVE:
            raise ValueError(
                f'algo.dynamic_sampling = "refill" sets aside groups whose group-relative advantages are all zero; '
                f'algo.advantage = "{a.advantage}" is not group-relative (use one of {", ".join(GROUP_RELATIVE)}, '
                'or dynamic_sampling = "off")'
            )
        if self.rollout.group_size < 2:
            raise ValueError('algo.dynamic_sampling = "refill" needs rollout.group_size >= 2 (a group of one never has a '
                             f'learning signal of its own); got {self.rollout.group_size}')
        return self

    @property
    def critic_settings(self) -> CriticConfig:
        """The ``[critic]`` section in force (its defaults when absent)."""
        return self.critic if self.critic is not None else CriticConfig()

    @model_validator(mode="after")
    def _check_critic_device(self) -> "Recipe":
        c = self.critic_settings
        if self.algo.advantage == "gae" and self.learner.num_gpus > 0 and c.num_gpus == 0 and not c.allow_cpu:
            raise ValueError(
                f"critic.num_gpus = 0 beside a GPU learner (learner.num_gpus = {self.learner.num_gpus:g}): the critic "
                "would train the whole value model in float32 on the CPU, far slower than the learner; give it GPUs "
                "(critic.num_gpus = 1 per critic rank) or ask for a CPU critic with critic.allow_cpu = true"
            )
        return self

    @model_validator(mode="after")
    def _check_reward(self) -> "Recipe":
        j = self.reward.judge
        if j is not None and j.output_regex is not None and j.model == "policy" and self.generator.backend == "http":
            raise ValueError('reward.judge.output_regex needs vLLM generators (generator.backend = "vllm") to judge with the policy')
        if j is not None and j.model != "policy":
            if j.num_gpus == 0 and self.generator.num_gpus > 0:
                raise ValueError(f"reward.judge.num_gpus = 0 beside GPU generators: the judge model {j.model!r} would "
                                 "need vLLM on the CPU of a GPU node, which the CUDA build of vLLM cannot do; give "
                                 "it reward.judge.num_gpus (1, or a share such as 0.5)")
            if j.num_gpus > 1 and j.num_gpus != int(j.num_gpus):
                raise ValueError(f"reward.judge.num_gpus = {j.num_gpus:g}: more than 1 GPU must be a whole number "
                                 "(the judge's engine is tensor parallel over them)")
        return self

    @model_validator(mode="after")
    def _check_mode(self) -> "Recipe":
        if self.mode == "sft" and not self.sft.steps:
            raise ValueError("mode = 'sft' needs sft.steps > 0")
        return self

    @property
    def max_staleness(self) -> int:
        """The staleness bound in force: 0 in ``sync`` mode and colocated (generation and training
        take turns: :mod:`agentrl.placement_plan`), else ``algo.max_staleness``."""
        return 0 if self.mode == "sync" or self.placement.mode == "colocated" else self.algo.max_staleness

    def resolved_run_dir(self) -> Path:
        """The run directory as an absolute path (a relative ``run_dir``, or ``runs/<name>``,
        is taken from the current directory once: Ray actors on other nodes, started from
        other directories, write into it by this path)."""
        return (Path(self.run_dir) if self.run_dir else Path("runs") / self.name).absolute()


UNSET = object()
"""The value of ``--set section.key=null``: the key is removed, so it takes its default."""


def parse_override(text: str) -> tuple[list[str], Any]:
    """Parse ``section.key=value`` into (key path, value); the value is read as a TOML value
    (``1e-5``, ``true``, ``"x"``, ``[1, 2]``) and falls back to a plain string; ``null`` is
    :data:`UNSET` (TOML has no null: the key goes back to its default, None for optional keys)."""
    if "=" not in text:
        raise ConfigError(f"--set {text!r}: expected section.key=value")
    key, raw = text.split("=", 1)
    path = [p for p in key.strip().split(".")]
    if not all(p.strip() for p in path):
        raise ConfigError(f"--set {text!r}: empty key in {key!r}")
    if raw.strip() == "null":
        return path, UNSET
    try:
        value = tomllib.loads(f"v = {raw.strip()}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw.strip()
    return path, value


def _apply_override(data: dict[str, Any], path: list[str], value: Any, source: str) -> None:
    node = data
    for i, part in enumerate(path[:-1]):
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(
                f"{source}: --set {'.'.join(path)}: {'.'.join(path[: i + 1])} is a value, not a section"
            )
        node = child
    if value is UNSET:
        node.pop(path[-1], None)  # the key takes its default (None for an optional key)
    else:
        node[path[-1]] = value


def _describe(value: Any) -> str:
    text = repr(value)
    if len(text) > 80:
        text = text[:77] + "..."
    return f"{text} ({type(value).__name__})"


def _format_errors(source: str, err: ValidationError) -> str:
    lines = []
    for e in err.errors():
        loc = ".".join(str(p) for p in e["loc"]) or "(top level)"
        kind = e["type"]
        if kind == "extra_forbidden":
            lines.append(f"{source}: {loc}: unknown key (given {_describe(e['input'])})")
        elif kind == "missing":
            lines.append(f"{source}: {loc}: required key is missing")
        else:
            msg = e["msg"]
            for prefix in ("Input should be ", "Value error, "):
                if msg.startswith(prefix):
                    msg = msg[len(prefix):]
            given = "" if kind == "value_error" else f"got {_describe(e['input'])}; "
            lines.append(f"{source}: {loc}: {given}expected {msg}" if given else f"{source}: {loc}: {msg}")
    return "\n".join(lines)


def validate_recipe(data: dict[str, Any], source: str = "<recipe>") -> Recipe:
    """Validate a recipe given as a dict; ``source`` names it in error messages."""
    try:
        return Recipe.model_validate(data)
    except ValidationError as err:
        raise ConfigError(_format_errors(source, err)) from None


def load_recipe(path: str | Path, overrides: list[str] | tuple[str, ...] = ()) -> Recipe:
    """Read, override and validate a recipe file. Raises ConfigError naming file and key."""
    path = Path(path)
    source = str(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise ConfigError(f"{source}: recipe file not found") from None
    except OSError as exc:
        raise ConfigError(f"{source}: cannot read recipe: {exc}") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{source}: malformed TOML: {exc}") from None
    for item in overrides:
        key_path, value = parse_override(item)
        _apply_override(data, key_path, value, source)
    return validate_recipe(data, source)
