"""agentrl from Python: the ``agentrl train``, ``check`` and ``eval`` commands as functions.

::

    import agentrl

    summary = agentrl.train("recipes/tiny_calc.toml", learner={"max_steps": 20}, sft={"steps": 0})
    print(summary.final_checkpoint)

A recipe is a TOML file's path, a dict (the TOML file's contents) or a validated
:class:`~agentrl.config.Recipe`. Keyword overrides are merged into it section by section
(``learner={"lr": 1e-5}`` changes one key of ``[learner]`` and keeps the others; ``name="x"``
sets a top-level key; ``None`` puts a key back to its default, as ``--set key=null`` does).
``set=["learner.lr=1e-5"]`` takes the CLI's ``--set`` strings as well. Errors are the CLI's,
raised: :class:`~agentrl.errors.ConfigError` naming the file and key, and so on.

As with the CLI, the recipe's directory and the current directory go on ``sys.path`` and the
modules the recipe names are shipped to every Ray worker (:mod:`agentrl.user_code`).
"""

from __future__ import annotations

import tomllib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agentrl.errors import ConfigError

if TYPE_CHECKING:
    from agentrl.config import Recipe
    from agentrl.engine.common.summary import RunSummary

__all__ = ["load", "train", "check", "evaluate"]

def _merge(base: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """``base`` with ``overrides`` merged in, tables key by key; a None value removes the key."""
    out = dict(base)
    for key, value in overrides.items():
        if value is None:
            out.pop(key, None)
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


def load(recipe: Any, *, set: Sequence[str] = (), **overrides: Any) -> Recipe:
    """The validated recipe: ``recipe`` (a path, a dict or a Recipe) with ``overrides`` merged
    in and then the ``--set`` strings of ``set`` applied. A path also puts its directory and the
    current directory on ``sys.path`` (:func:`agentrl.user_code.use_user_code`). Raises
    ConfigError naming the source and the key."""
    from agentrl.config import UNSET, Recipe, parse_override, validate_recipe
    from agentrl.user_code import use_user_code

    if isinstance(recipe, Recipe):
        data, source = recipe.model_dump(mode="json", by_alias=True, exclude_unset=True), "<Recipe>"
        use_user_code(None)
    elif isinstance(recipe, dict):
        data, source = dict(recipe), "<dict>"
        use_user_code(None)
    elif isinstance(recipe, (str, Path)):
        path = Path(recipe)
        source = str(path)
        try:
            data = tomllib.loads(path.read_text())
        except FileNotFoundError:
            raise ConfigError(f"{source}: recipe file not found") from None
        except OSError as exc:
            raise ConfigError(f"{source}: cannot read recipe: {exc}") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{source}: malformed TOML: {exc}") from None
        use_user_code(path)
    else:
        raise ConfigError(f"a recipe is a TOML file's path, a dict or an agentrl.config.Recipe; got {type(recipe).__name__}")
    data = _merge(data, overrides)
    for item in set:
        key_path, value = parse_override(item)
        nested: Any = None if value is UNSET else value  # None: the key goes back to its default
        for part in reversed(key_path):
            nested = {part: nested}
        data = _merge(data, nested)
    return validate_recipe(data, source)


def train(
    recipe: Any, *, fresh: bool = False, resume_from: str | Path | None = None, hooks: Sequence[Any] = (),
    set: Sequence[str] = (), **overrides: Any,
) -> RunSummary:
    """Run ``recipe`` to the end, as ``agentrl train`` does; its
    :class:`~agentrl.engine.common.summary.RunSummary` (run directory, steps, final checkpoint,
    counters). ``fresh``/``resume_from``: as ``--fresh``/``--resume-from``; ``hooks``: RL loop
    hooks (:class:`~agentrl.engine.loop.loop.LoopHook`)."""
    from agentrl.engine.controller import Controller
    from agentrl.quiet import no_progress_bars

    r = load(recipe, set=set, **overrides)
    with no_progress_bars():  # agentrl's console only: no transformers/Hub bars beside it
        return Controller(r, hooks=hooks, fresh=fresh, resume_from=resume_from).run()


def check(recipe: Any, *, dry_run: bool = False, echo: Callable[[str], None] = print, set: Sequence[str] = (), **overrides: Any) -> bool:
    """Validate ``recipe`` (raises ConfigError when it is not valid); with ``dry_run``, also
    resolve its model, data, environment and sandbox offline, one line each through ``echo``.
    True when every check passed."""
    r = load(recipe, set=set, **overrides)
    if not dry_run:
        from agentrl.dryrun import load_reward_functions

        load_reward_functions(r)  # the user's reward functions import (a ConfigError names the key)
        return True
    from agentrl.dryrun import dry_run as run_checks
    from agentrl.quiet import no_progress_bars

    with no_progress_bars():
        return run_checks(r, echo=echo)


def evaluate(recipe: Any, checkpoint: str | Path, *, set: Sequence[str] = (), **overrides: Any) -> RunSummary:
    """Held-out metrics of ``checkpoint`` (a Hugging Face folder such as ``RUN_DIR/final``, or a
    hub id) on ``recipe``'s evaluation rows, as ``agentrl eval`` does: ``mode = "eval"``, nothing
    trained, in a run directory of its own, ``RUN_DIR/evals/<date-time>/`` (the training run's
    files are never touched). The metrics are in the summary's run directory (``summary.json``,
    ``metrics.jsonl``, ``eval_samples.jsonl``)."""
    from agentrl.engine.common.run_dir import RunDir

    r = load(recipe, set=[*set, "mode=eval", f"model.path={str(checkpoint)!r}", "sft.steps=0"], **overrides)
    return train(r, run_dir=str(RunDir(r.resolved_run_dir()).new_eval_dir()))
