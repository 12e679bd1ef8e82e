"""The ``agentrl`` command.

::

    agentrl train RECIPE [--set section.key=value ...]   run an experiment (resumes from its newest checkpoint)
          [--fresh | --resume-from RUN_DIR/checkpoints/step_N]
    agentrl check RECIPE [--set section.key=value ...]   validate a recipe without running it
    agentrl eval RECIPE [--checkpoint DIR] [--show N]     held-out metrics of a checkpoint (default: the
                                                          recipe's model) in RUN_DIR/evals/DATE-TIME;
                                                          --show prints N episodes
    agentrl report RUN_DIR                                plots and a summary of a run
    agentrl export CHECKPOINT_DIR OUT_DIR                 Hugging Face folder of a training checkpoint
    agentrl model init tiny OUT_DIR [--env ID]            build a tiny Qwen2 model + tokenizer
    agentrl model import SOURCE OUT_DIR [--dtype D]       a GGUF file or packaged model -> HF folder

The user's own modules (``env.id = "my_envs:MyEnv"``, ``env.agent``, ``sft.source``...) are
found beside the recipe or in the current directory: both go at the front of ``sys.path``, and a
run ships the modules the recipe names to every Ray worker (:mod:`agentrl.user_code`); no
``PYTHONPATH`` needed.

Errors agentrl raises on purpose print one clear message and exit with status 2; anything else
is a bug and shows its traceback. Third-party progress bars (transformers, huggingface_hub,
datasets, tqdm) are off on this console (:mod:`agentrl.quiet`): agentrl prints its own.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from agentrl.errors import AgentRLError, exception_in_words


def train_command(recipe: str, run_dir: str, model: str, *overrides: str) -> list[str]:
    """The argv of ``agentrl train RECIPE`` in a subprocess (this interpreter), writing into
    ``run_dir`` with ``model.path = model``, plus one ``--set`` per override
    (``"section.key=value"``): what the end-to-end tests and the benchmarks launch."""
    cmd = [sys.executable, "-m", "agentrl.cli", "train", recipe, "--set", f"run_dir='{run_dir}'", "--set", f"model.path='{model}'"]
    for item in overrides:
        cmd += ["--set", item]
    return cmd


def _version() -> str:
    """The installed distribution's version (``pyproject.toml``)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("agentrl")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown (not installed)"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="agentrl", description="Asynchronous RL for tool-using language models.")
    p.add_argument("--version", action="version", version=f"agentrl {_version()}")
    sub = p.add_subparsers(dest="command", required=True)
    for name, help_ in (("train", "run an experiment"), ("check", "validate a recipe without running it")):
        c = sub.add_parser(name, help=help_)
        c.add_argument("recipe", help="path to a TOML recipe")
        c.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                       help="override a recipe value, e.g. --set learner.lr=1e-5 (repeatable)")
        if name == "check":
            c.add_argument("--dry-run", action="store_true",
                           help="also resolve the model, data, environment and sandbox offline")
        else:
            start = c.add_mutually_exclusive_group()
            start.add_argument("--fresh", action="store_true",
                               help="start over at step 0; an earlier run in the run directory is renamed aside (RUN_DIR.old-DATE)")
            start.add_argument("--resume-from", metavar="DIR/STEP",
                               help="go on from this checkpoint (RUN_DIR/checkpoints/step_N) or run directory (its newest checkpoint)")
    ev = sub.add_parser("eval", help="evaluate a checkpoint on the recipe's held-out rows (mode eval)")
    ev.add_argument("recipe", help="path to a TOML recipe")
    ev.add_argument("--checkpoint", help="a Hugging Face folder (e.g. RUN_DIR/final) or hub id (default: the recipe's model.path)")
    ev.add_argument("--show", type=int, default=0, metavar="N",
                    help="print N of the evaluated episodes turn by turn, with tool calls and rewards (evaluates at least N rows)")
    ev.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE", help="override a recipe value")
    rep = sub.add_parser("report", help="plots and a summary of a run directory")
    rep.add_argument("run_dir", help="a run directory (holds metrics.jsonl)")
    ex = sub.add_parser("export", help="write a training checkpoint's model as a Hugging Face folder")
    ex.add_argument("checkpoint_dir", help="a learner checkpoint (RUN_DIR/checkpoints/step_N or its learner/ folder)")
    ex.add_argument("out_dir", help="folder to write (replaced atomically if it exists)")
    ex.add_argument("--merge", action="store_true", help="LoRA checkpoints: write the base model with the adapter merged in (default: the adapter folder)")
    m = sub.add_parser("model", help="build models")
    msub = m.add_subparsers(dest="model_command", required=True)
    init = msub.add_parser("init", help="build a tiny model and tokenizer as a Hugging Face folder")
    init.add_argument("kind", choices=["tiny"], help="model kind")
    init.add_argument("out_dir", help="folder to create")
    init.add_argument("--env", default="agentrl/Calc-v0", help="environment whose text trains the tokenizer")
    init.add_argument("--data", default="synthetic:calc", help="dataset whose rows train the tokenizer")
    init.add_argument("--rows", type=int, default=2000, help="rows of --data to use")
    init.add_argument("--overwrite", action="store_true", help="replace OUT_DIR if it exists")
    imp = msub.add_parser("import", help="convert a GGUF model (a file or a packaged model name) to a Hugging Face folder")
    imp.add_argument("source", help="a .gguf file, or a packaged model name (smollm2-135m-instruct)")
    imp.add_argument("out_dir", help="folder to create")
    imp.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"], help="parameter dtype to write")
    imp.add_argument("--overwrite", action="store_true", help="replace OUT_DIR if it exists")
    return p


def _stop_on_signals() -> None:
    """SIGTERM (a scheduler, ``kill``, a container stop) stops a run the way Ctrl-C does: the
    controller's clean-up runs (actors, vLLM engines, sandboxes stopped) and the exit status is
    130. SIGINT is honoured even where the shell started the process with it ignored (a
    background job of a script)."""
    if threading.current_thread() is not threading.main_thread():
        return
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, lambda *_: signal.raise_signal(signal.SIGINT))


def _train(args: argparse.Namespace, hooks: Sequence[Any] = ()) -> int:
    from agentrl.config import load_recipe
    from agentrl.engine.controller import Controller
    from agentrl.user_code import use_user_code

    use_user_code(args.recipe)
    recipe = load_recipe(args.recipe, args.overrides)
    _stop_on_signals()
    controller = Controller(recipe, hooks=hooks, fresh=getattr(args, "fresh", False), resume_from=getattr(args, "resume_from", None))
    try:
        summary = controller.run()
    except AgentRLError as exc:
        logs = controller.run_dir.logs
        if logs.is_dir() and any(logs.iterdir()):  # the actors' own output says more
            exc.logs = logs  # type: ignore[attr-defined]
        raise
    except Exception as exc:  # not one of agentrl's own failures: said in one line, the traceback kept in a file
        raise _unexpected(exc, controller.run_dir.logs) from exc
    print(
        f"done: {summary.steps} steps, weight version {summary.version}, {summary.samples_trained} samples trained, "
        f"{summary.dropped_stale} dropped as stale, {summary.infra_failures} infra failures, "
        f"{summary.agent_failures} agent failures; "
        f"checkpoint {summary.final_checkpoint}"
    )
    if summary.ended_early:
        print(f"ended early: {summary.ended_early}")
    return 0


def _unexpected(exc: BaseException, logs: Path) -> AgentRLError:
    """An :class:`AgentRLError` for ``exc``, an exception agentrl did not expect (a bug, a broken
    installation, user code failing at import): one line in words; the full traceback goes to
    ``logs/traceback.txt`` (where it could not be written, the message says so)."""
    text = "".join(traceback.format_exception(exc))
    try:
        logs.mkdir(parents=True, exist_ok=True)
        (logs / "traceback.txt").write_text(text)
        where = f"the full traceback is in {logs / 'traceback.txt'}"
    except OSError as write_error:
        where = f"its traceback could not be written to {logs} ({write_error})"
    err = AgentRLError(f"the run stopped on an unexpected error: {exception_in_words(exc)} ({where}). "
                       "Rerun the same command to go on from the newest checkpoint, if the run wrote one")
    err.logs = logs  # type: ignore[attr-defined]
    return err


def _eval(args: argparse.Namespace, hooks: Sequence[Any] = ()) -> int:
    """``agentrl eval``: the recipe in mode eval (nothing trained) on ``--checkpoint`` (default:
    its own model); with ``--show N``, at least N rows are evaluated and N episodes printed.

    The evaluation is a run of its own in ``RUN_DIR/evals/<date-time>/`` (RUN_DIR: the recipe's
    run directory): its summary, metrics, decoded episodes and report go there, and the training
    run's ``summary.json`` and ``metrics.jsonl`` are never touched. The last line names it."""
    from agentrl.config import load_recipe
    from agentrl.engine.common.run_dir import RunDir
    from agentrl.episode_show import read_episodes, render_episode
    from agentrl.errors import ConfigError
    from agentrl.report import write_report
    from agentrl.user_code import use_user_code

    if args.show < 0:
        raise ConfigError(f"--show {args.show}: expected a number of episodes, 0 or more")
    args.overrides = [*args.overrides, "mode=eval", "sft.steps=0"]
    if args.checkpoint is not None:
        args.overrides.append(f"model.path={args.checkpoint!r}")
    use_user_code(args.recipe)
    recipe = load_recipe(args.recipe, args.overrides)
    if args.show:
        e = recipe.eval
        if e.limit and e.limit < args.show:  # 0 in mode eval: every row
            args.overrides.append(f"eval.limit={args.show}")
        args.overrides.append(f"eval.samples={max(e.samples, args.show)}")
    out = RunDir(recipe.resolved_run_dir()).new_eval_dir()
    args.overrides.append(f"run_dir={str(out)!r}")
    try:
        status = _train(args, hooks)
    except BaseException:
        if not any(out.iterdir()):  # refused before it wrote anything: no empty folder left behind
            out.rmdir()
        raise
    path = RunDir(out).eval_samples
    if args.show:
        episodes = read_episodes(path)[: args.show]
        for i, record in enumerate(episodes, 1):
            print()
            print(render_episode(record, i, len(episodes)))
        print(f"\n{len(episodes)} episode{'s' if len(episodes) != 1 else ''} shown (of {args.show} asked); all in {path}")
    try:
        report = f"report (plots, the trajectory browser): {write_report(out) / 'index.html'}"
    except AgentRLError as exc:  # no metrics to report on: say so (shown episodes were shown)
        report = f"no report written ({exc}); `agentrl report {out}` writes one"
    print(f"evaluation written to {out} (summary.json, metrics.jsonl, eval_samples.jsonl); {report}")
    return status


def _check(args: argparse.Namespace) -> int:
    from agentrl.config import load_recipe
    from agentrl.errors import ConfigError
    from agentrl.user_code import use_user_code

    use_user_code(args.recipe)
    recipe = load_recipe(args.recipe, args.overrides)
    what = f"mode={recipe.mode}, model={recipe.model.path}, {'agent=' + recipe.env.agent if recipe.env.agent else 'env=' + recipe.env.id}"
    if not args.dry_run:
        from agentrl.dryrun import load_reward_functions

        try:
            load_reward_functions(recipe)  # the user's reward functions import
        except ConfigError as exc:
            raise ConfigError(f"{args.recipe}: {exc}") from None
        print(f"{args.recipe}: ok ({what})")
        return 0
    from agentrl.dryrun import dry_run

    lines: list[str] = []
    passed = dry_run(recipe, echo=lines.append)
    errors = sum(1 for line in lines if line.split()[:1] == ["error"])
    offline = sum(1 for line in lines if line.split()[:1] == ["offline"])
    warnings = sum(1 for line in lines if line.split()[:1] == ["warning"])
    if not passed or errors:
        head = f"{errors} error{'s' if errors != 1 else ''}" if errors else "failed"
    else:
        head = "ok"
    print(f"{args.recipe}: {head} ({what})" + (f"; {offline} check(s) need the network" if offline else "")
          + (f"; {warnings} warning{'s' if warnings != 1 else ''}" if warnings else ""))
    for line in lines:
        print(line)
    return 0 if passed and not errors else 2


def _model_import(args: argparse.Namespace) -> int:
    from agentrl.models.importing import import_model

    path = import_model(args.source, args.out_dir, dtype=args.dtype, overwrite=args.overwrite)
    print(f"{args.source} imported to {path}")
    return 0


def _model_init(args: argparse.Namespace) -> int:
    from agentrl.envs.corpus import tokenizer_corpus
    from agentrl.envs.data import load_rows
    from agentrl.models.tiny import build_tiny_model

    rows = load_rows(args.data, limit=args.rows)
    path = build_tiny_model(args.out_dir, tokenizer_corpus(args.env, rows), overwrite=args.overwrite)
    print(f"tiny model written to {path}")
    return 0


def main(argv: Sequence[str] | None = None, *, hooks: Sequence[Any] = ()) -> int:
    """Entry point of the ``agentrl`` console script; returns the exit status. ``hooks``: RL
    loop hooks for ``train`` and ``eval`` (:class:`agentrl.engine.loop.loop.LoopHook`; fault
    injection in tests)."""
    args = _parser().parse_args(argv)
    from agentrl.quiet import no_progress_bars, quiet_environment

    added = quiet_environment()  # before the libraries are imported: no third-party progress bars on this console
    try:
        with no_progress_bars():
            return _command(args, hooks)
    finally:
        for name in added:
            os.environ.pop(name, None)


def _command(args: argparse.Namespace, hooks: Sequence[Any]) -> int:
    """Run the parsed command; its exit status (2 for an AgentRLError, said in one line)."""
    try:
        if args.command == "train":
            return _train(args, hooks)
        if args.command == "check":
            return _check(args)
        if args.command == "eval":
            return _eval(args, hooks)
        if args.command == "report":
            from agentrl.report import write_report

            out = write_report(args.run_dir)
            print(f"report written to {out}/ (index.html: curves and trajectories; training.png, summary.md)")
            return 0
        if args.command == "export":
            from agentrl.engine.training.checkpoint import export_checkpoint

            print(f"exported to {export_checkpoint(args.checkpoint_dir, args.out_dir, merge=args.merge)}")
            return 0
        if args.model_command == "import":
            return _model_import(args)
        return _model_init(args)
    except AgentRLError as exc:
        print(f"agentrl: error: {exc}", file=sys.stderr)
        if getattr(exc, "logs", None) is not None:
            print(f"agentrl: what the generators, learners and rollout workers printed: {exc.logs}/", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("agentrl: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
