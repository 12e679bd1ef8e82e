"""Rollout throughput: multi-turn tool episodes through the engine against raw vLLM.

For each concurrency level C, runs ``--episodes`` Calc-v0 episodes (model turns, code in the
bubblewrap sandbox, interpreter output appended, next turn) through the engine's rollout path
(``play_episode`` over :class:`~agentrl.engine.generation.generator.VllmGenerator`), then, in the same process
and on the same engine(s), raw vLLM generation of exactly the same number of tokens per episode
for the same prompts (one request each, ``ignore_eos``) at the same concurrency. Reports
generated tokens/s of both and their ratio, median over ``--repeats``; also 1 vs 2 generators.

``--sandboxes bubblewrap arithmetic`` adds a second engine pass per setting whose tool runs in
this process (:class:`ArithmeticSandbox`: the Calc-v0 programs' arithmetic evaluated from the
syntax tree, no process at all). Its ratio is the engine's own overhead with the tool's cost
taken out; the gap between the two is what the sandbox costs on these cores.

A third pass, *replay*, sends raw vLLM the engine pass's own requests (each episode's turns one
after the other, same prompts and lengths) without environment, sandbox or rendering:
replay/raw is what splitting an episode into turns costs vLLM itself, engine/replay what the
engine adds on top (tool time included).

    .venv/bin/python benchmarks/rollout.py --model runs/tiny_calc/sft --concurrency 8 32 64 128
    .venv/bin/python benchmarks/rollout.py --model runs/tiny_calc/sft --preload --episodes 256 --concurrency 64 --generators 1 --repeats 5 --write

The model should be one that calls the tool (e.g. the SFT stage of ``recipes/tiny_calc.toml``),
so that episodes really are multi-turn.

``--stops ids strings`` runs the engine pass both ways: ``</code>`` also sent as a stop token id
(what the engine does, :mod:`agentrl.engine.episodes.stops`), and as a stop string alone, which vLLM checks
in its front end after the engine core has moved on.

Every engine and raw pass also records how many cores the whole machine kept busy
(``/proc/stat``: every process, this one, vLLM's, the sandbox's and the kernel).

``--omp-wait-policy ACTIVE PASSIVE`` starts one set of engines per ``OMP_WAIT_POLICY`` (idle
engines cost nothing) and alternates the passes between them; without it the engines inherit
this process's environment.

``--turn-tokens N`` fixes the episodes' shape instead (:class:`ShapedCalcEnv`): ``--turns`` model
turns of exactly N tokens each (``ignore_eos``, no stop string), each but the last followed by a
real execution of the row's program in the sandbox and its interpreter message rendered into the
template. The tiny model's own Calc turns are ~12 tokens, far shorter than a code-interpreter
model's (hundreds), so per-turn costs weigh much more than they would in a real run; the shaped
workload measures the same machinery at a chosen turn length, with any model.

The same text is printed and, with ``--write``, put in ``benchmarks/RESULTS.md`` in a marked
block of its own (first written at the end of the "rollout" section; the prose around it is
written by people): the exact command, the date span, the machine (CPUs, memory, load average at the end), episodes, repeats, model and the
table of medians. The block's key is ``rollout``, the model folder's name, the sandboxes and every
other argument not at its default (``--repeats`` aside), e.g. ``rollout sft bubblewrap arithmetic
concurrency=64 episodes=256 generators=1 preload=none``: a rerun of the same setting replaces its
block, another setting gets its own.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
from _measure import busy_cpu_s, quantile, run_header, emit


class ArithmeticSandbox:
    """A stand-in for the interpreter that costs (almost) nothing: runs programs made of integer
    arithmetic, assignments and ``print`` (what Calc-v0 episodes write) by walking their syntax
    tree in this process; anything else gets an error message as stderr. Not a sandbox: a
    benchmark baseline."""

    async def run(self, code: str, **_: Any) -> Any:
        import ast
        import operator

        from agentrl.sandbox.base import ExecResult

        ops = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod}
        names: dict[str, int] = {}
        out: list[str] = []

        def value(node: ast.AST) -> int:
            if isinstance(node, ast.Constant) and isinstance(node.value, int):
                return node.value
            if isinstance(node, ast.Name) and node.id in names:
                return names[node.id]
            if isinstance(node, ast.BinOp) and type(node.op) in ops:
                return ops[type(node.op)](value(node.left), value(node.right))
            if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
                return -value(node.operand)
            raise ValueError(f"unsupported: {ast.dump(node)[:60]}")

        try:
            for stmt in ast.parse(code).body:
                if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name):
                    names[stmt.targets[0].id] = value(stmt.value)
                elif isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call) and getattr(stmt.value.func, "id", "") == "print":
                    out.append(" ".join(str(value(a)) for a in stmt.value.args))
                elif isinstance(stmt, ast.Expr):
                    value(stmt.value)
                else:
                    raise ValueError("unsupported statement")
            stdout, stderr, code_ = "".join(line + "\n" for line in out), "", 0
        except (SyntaxError, ValueError, ZeroDivisionError, RecursionError) as exc:
            stdout, stderr, code_ = "", f"{type(exc).__name__}: {exc}\n", 1
        return ExecResult(stdout=stdout, stderr=stderr, exit_code=code_, timed_out=False, memory_exceeded=False, wall_s=0.0)

    async def aclose(self) -> None:
        pass


class TimedTool:
    """Wraps a sandbox (or :class:`ArithmeticSandbox`) and records the wall time of each ``run``
    as the episode awaits it: queueing for a worker included."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.latencies_s: list[float] = []

    async def run(self, code: str, **kw: Any) -> Any:
        t0 = time.monotonic()
        try:
            return await self.inner.run(code, **kw)
        finally:
            self.latencies_s.append(time.monotonic() - t0)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def shaped_env_class() -> type:
    """:class:`ShapedCalcEnv` (defined on first use: the envs package is imported lazily)."""
    from agentrl.envs.calc import CalcEnv

    class ShapedCalcEnv(CalcEnv):
        """Calc-v0 with a fixed shape: whatever a model turn says, turns 1 .. max_turns-1 run the
        row's program (``print(a*b+c)``) through the env's real tool path (parser, sandbox,
        interpreter message) and the last turn is scored as a final answer."""

        async def astep(self, action: str) -> Any:
            assert self.row is not None
            if self.turn + 1 >= self.max_turns:
                return await super().astep("\\boxed{0}")
            expr = str(self.row["question"]).removeprefix("Compute ").removesuffix(".")
            return await super().astep(f"<code>print({expr})</code>")

    return ShapedCalcEnv


@dataclass
class EnginePass:
    """One engine pass: its wall time, and per episode what it generated and asked vLLM for."""

    wall_s: float
    generated: list[int]
    """Tokens each episode generated."""
    prompts: list[list[int]]
    """Each episode's first prompt."""
    turns: float
    """Model turns per episode (mean)."""
    tool_calls: float
    """Tool calls per episode (mean)."""
    requests: list[list[tuple[list[int], int]]]
    """Each episode's generation requests: (prompt ids, tokens generated) per turn."""
    tool_s: list[float]
    """Wall time of each tool call as the episode saw it (queueing included)."""


async def _engine_pass(
    gens: list[Any], tok: Any, rows: list[dict], concurrency: int, sandbox: Any, turn_tokens: int, turns: int, stop_ids: bool = True
) -> EnginePass:
    from agentrl.engine.episodes.env_episode import play_episode
    from agentrl.envs.calc import CalcEnv

    sem = asyncio.Semaphore(concurrency)
    out: list[Any] = [None] * len(rows)
    sandbox = TimedTool(sandbox)
    if turn_tokens:
        env_cls, sampling, max_new = shaped_env_class(), {"temperature": 1.0, "ignore_eos": True}, turn_tokens
    else:
        env_cls, sampling, max_new = CalcEnv, {"temperature": 1.0, "stop": ["</code>"]}, 48

    async def one(i: int) -> None:
        async with sem:
            env = env_cls(sandbox=sandbox, max_turns=turns, timeout_s=5.0)
            gen = gens[i % len(gens)]
            out[i] = await play_episode(
                env, tok, gen.generate, row=rows[i], group_id=f"g{i}", prompt_index=i, sample_index=0, seed=0,
                sampling=sampling, max_new_tokens=max_new, max_episode_tokens=max(512, 4 * turns * max_new),
                single_token_stops=stop_ids,
            )

    t0 = time.monotonic()
    await asyncio.gather(*[one(i) for i in range(len(rows))])
    wall = time.monotonic() - t0
    generated = [t.num_generated for t in out]
    prompts = [t.tokens[: next(j for j, m in enumerate(t.loss_mask) if m)] if any(t.loss_mask) else t.tokens for t in out]
    return EnginePass(
        wall, generated, prompts, statistics.mean(t.metrics["turns"] for t in out),
        statistics.mean(t.metrics["tool_calls"] for t in out), [_turn_requests(t) for t in out], sandbox.latencies_s,
    )


def _turn_requests(traj: Any) -> list[tuple[list[int], int]]:
    """The episode's generation requests: ``(prompt ids, tokens generated)`` per model turn."""
    out = []
    i = 0
    mask = traj.loss_mask
    while i < len(mask):
        if mask[i]:
            j = i
            while j < len(mask) and mask[j]:
                j += 1
            out.append((traj.tokens[:i], j - i))
            i = j
        else:
            i += 1
    return out


async def _replay_pass(gens: list[Any], episodes: list[list[tuple[list[int], int]]], concurrency: int) -> float:
    """Raw vLLM with the engine's request structure: each episode's turns as consecutive
    requests (same prompts, same lengths), without environment, sandbox or rendering."""
    sem = asyncio.Semaphore(concurrency)

    async def one(i: int) -> None:
        async with sem:
            for prompt, n in episodes[i]:
                await gens[i % len(gens)].generate(prompt, {"temperature": 1.0, "max_tokens": n, "ignore_eos": True})

    t0 = time.monotonic()
    await asyncio.gather(*[one(i) for i in range(len(episodes))])
    return time.monotonic() - t0


async def _raw_pass(gens: list[Any], prompts: list[list[int]], lengths: list[int], concurrency: int) -> float:
    sem = asyncio.Semaphore(concurrency)

    async def one(i: int) -> None:
        async with sem:
            await gens[i % len(gens)].generate(prompts[i], {"temperature": 1.0, "max_tokens": max(1, lengths[i]), "ignore_eos": True})

    t0 = time.monotonic()
    await asyncio.gather(*[one(i) for i in range(len(prompts))])
    return time.monotonic() - t0


async def main_async(args: argparse.Namespace) -> tuple[list[dict[str, Any]], list[tuple[str, str]]]:
    """Run every pass ``args`` asks for. Returns one dict per pass (see :func:`format_tables` for
    what it holds) and the (tool, stop) variants that were run."""
    from agentrl.engine.generation.generator import EngineSettings, VllmGenerator
    from agentrl.envs.data import load_rows
    from agentrl.models.loading import load_tokenizer
    from agentrl.sandbox import create_sandbox

    tok = load_tokenizer(args.model)
    rows = load_rows("synthetic:calc", limit=args.episodes, seed=123)
    sandboxes = {
        name: ArithmeticSandbox() if name == "arithmetic" else create_sandbox(
            "bubblewrap", max_concurrency=args.sandbox_concurrency, timeout_s=5.0, memory_mb=256,
            **({"preload": args.preload} if args.preload is not None else {}),
        )
        for name in args.sandboxes
    }
    stops = ["ids"] if args.turn_tokens else args.stops  # shaped turns have no stop string
    variants = [(name, stop) for name in args.sandboxes for stop in stops]
    results = []
    for n_gen in args.generators:
        extra = {"block_size": args.block_size} if args.block_size else {}
        engines: dict[str, list[Any]] = {}
        for policy in args.omp_wait_policy or ["inherited"]:  # idle engines cost no CPU: all stay up, passes alternate
            if args.omp_wait_policy:
                os.environ["OMP_WAIT_POLICY"] = policy  # read by the engine processes at their start
            engines[policy] = [
                VllmGenerator(EngineSettings(model=args.model, max_model_len=1024, kv_cache_gib=0.5, cpu_threads_bind=args.bind, extra=extra))
                for _ in range(n_gen)
            ]
            for g in engines[policy]:
                await g.start()
        for gens in engines.values():  # untimed: start the sandbox workers, warm the engine(s)
            for sandbox in sandboxes.values():
                if hasattr(sandbox, "start"):
                    await sandbox.start()
                await _engine_pass(gens, tok, rows[:16], 8, sandbox, args.turn_tokens, args.turns)
        for c in args.concurrency:
            for _ in range(args.repeats):
                for (policy, gens), (name, stop) in itertools.product(engines.items(), variants):
                    # each engine pass, then raw vLLM on its tokens, then the replay of its requests
                    cpu0 = busy_cpu_s()
                    e = await _engine_pass(gens, tok, rows, c, sandboxes[name], args.turn_tokens, args.turns, stop == "ids")
                    cpu1 = busy_cpu_s()
                    wall_r = await _raw_pass(gens, e.prompts, e.generated, c)
                    cpu2 = busy_cpu_s()
                    wall_p = await _replay_pass(gens, e.requests, c)
                    tokens = sum(e.generated)
                    results.append({
                        "key": (policy, name, stop, n_gen, c), "engine": tokens / e.wall_s, "raw": tokens / wall_r,
                        "replay": tokens / wall_p, "turns": e.turns, "calls": e.tool_calls,
                        "tool_p50": quantile(e.tool_s, 0.5), "tool_p90": quantile(e.tool_s, 0.9),
                        "busy_engine": (cpu1 - cpu0) / e.wall_s, "busy_raw": (cpu2 - cpu1) / wall_r,
                    })
        for gens in engines.values():
            for g in gens:
                await g.shutdown()
    for sandbox in sandboxes.values():
        await sandbox.aclose()
    return results, variants


def format_tables(args: argparse.Namespace, results: list[dict[str, Any]], variants: list[tuple[str, str]]) -> str:
    """The Markdown table of ``results``: one row per setting (OpenMP wait policy, tool, stop,
    generators, concurrent episodes), each cell the median over the repeats of that setting.
    ``results`` holds one dict per pass, as :func:`main_async` makes them: ``key`` (the setting),
    ``engine`` / ``raw`` / ``replay`` (generated tokens/s of each pass), ``turns`` and ``calls``
    (model turns and tool calls per episode, means), ``tool_p50`` / ``tool_p90`` (tool-call wall
    time as the episode saw it, seconds), ``busy_engine`` / ``busy_raw`` (cores the whole machine
    kept busy during the engine and raw passes). ``variants``: the (tool, stop) pairs run."""
    keys = [
        (policy, name, stop, n_gen, c)
        for policy in args.omp_wait_policy or ["inherited"] for name, stop in variants for n_gen in args.generators for c in args.concurrency
    ]

    def label(key: tuple[Any, ...]) -> str:
        policy, name, stop, n_gen, c = key
        return f"| {policy} | {name} | {stop if not args.turn_tokens else '-'} | {n_gen} | {c} |"

    lines = [
        (
            "| OpenMP wait | tool | stop | generators | concurrent episodes | engine tok/s | raw vLLM tok/s | ratio | "
            "replay tok/s | replay/raw | engine/replay | turns/episode | tool calls/episode | tool call ms p50 / p90 | "
            "busy cores engine / raw |"
        ),
        "| --- | --- | --- | ---: | ---: " + "| ---: " * 10 + "|",
    ]
    for key in keys:
        rs = [r for r in results if r["key"] == key]

        def med(f: Callable[[dict[str, Any]], float], rs: list[dict[str, Any]] = rs) -> float:
            return statistics.median(f(r) for r in rs)

        lines.append(
            f"{label(key)} {med(lambda r: r['engine']):.0f} | {med(lambda r: r['raw']):.0f} | {med(lambda r: r['engine'] / r['raw']):.2f} | "
            f"{med(lambda r: r['replay']):.0f} | {med(lambda r: r['replay'] / r['raw']):.2f} | {med(lambda r: r['engine'] / r['replay']):.2f} | "
            f"{med(lambda r: r['turns']):.2f} | {med(lambda r: r['calls']):.2f} | {med(lambda r: r['tool_p50']) * 1e3:.0f} / {med(lambda r: r['tool_p90']) * 1e3:.0f} | {med(lambda r: r['busy_engine']):.2f} / {med(lambda r: r['busy_raw']):.2f} |"
        )
    return "\n".join(lines)


def format_block(args: argparse.Namespace, results: list[dict[str, Any]], variants: list[tuple[str, str]], started: float) -> str:
    """What is printed and what ``--write`` puts in RESULTS.md: :func:`run_header` (the exact
    command, the span from ``started``, a ``time.time()`` value, to now, and the machine), the
    episodes' shape, episodes per pass, repeats and model, then :func:`format_tables`."""
    shape = f"shaped: {args.turns} turns of {args.turn_tokens} tokens" if args.turn_tokens else f"up to {args.turns} turns, as the model writes them"
    head = (
        f"{run_header(started)}. Calc-v0 episodes ({shape}): {args.episodes} per pass, {args.repeats} repeats "
        f"(medians), model `{args.model}`. Generated tokens/s of the engine pass, of raw vLLM asked for the same "
        "tokens per episode in one request each, and of raw vLLM replaying the engine's own requests; every setting "
        "preceded by an untimed warm-up."
    )
    return head + "\n\n" + format_tables(args, results, variants)


_KEY_SKIP = ("model", "sandboxes", "repeats", "write")
"""Arguments left out of :func:`block_key`: named in it anyway, or not changing what is measured."""


def block_key(args: argparse.Namespace, ap: argparse.ArgumentParser) -> str:
    """The RESULTS.md block this run's ``--write`` replaces: ``rollout``, the model folder's name,
    the sandboxes, then ``name=value`` for every other argument not at its default (repeats
    aside), so that runs of other settings get blocks of their own. No ``--`` in it: the key
    sits inside an HTML comment."""
    parts = ["rollout", Path(args.model).name, *args.sandboxes]
    for name, value in sorted(vars(args).items()):
        if name in _KEY_SKIP or value == ap.get_default(name):
            continue
        shown = (" ".join(map(str, value)) or "none") if isinstance(value, list) else str(value)
        parts.append(f"{name.replace('_', '-')}={shown}")
    return " ".join(parts)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, help="a Hugging Face folder (a tool-calling tiny model)")
    ap.add_argument("--episodes", type=int, default=128)
    ap.add_argument("--concurrency", type=int, nargs="+", default=[8, 32, 64, 128])
    ap.add_argument("--generators", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--bind", default="0-1", help="VLLM_CPU_OMP_THREADS_BIND")
    ap.add_argument("--block-size", type=int, default=0, help="vLLM KV-cache block size (0: the engine's default, 32 on CPU)")
    ap.add_argument("--sandboxes", nargs="+", default=["bubblewrap", "arithmetic"], choices=["bubblewrap", "arithmetic"],
                    help="where the episodes' code runs (arithmetic: in process, no sandbox; a baseline)")
    ap.add_argument("--sandbox-concurrency", type=int, default=8, help="bubblewrap workers")
    ap.add_argument("--turn-tokens", type=int, default=0, help="fixed tokens per model turn (0: the model's own Calc turns)")
    ap.add_argument("--turns", type=int, default=3, help="model turns per episode (the limit; exact with --turn-tokens)")
    ap.add_argument("--stops", nargs="+", default=["ids"], choices=["ids", "strings"],
                    help="how turns end at </code>: ids = also a stop token id (the engine's default), strings = "
                         "vLLM's front-end string check alone; both: one engine pass each, to compare")
    ap.add_argument("--omp-wait-policy", nargs="+", default=None, choices=["PASSIVE", "ACTIVE"],
                    help="OMP_WAIT_POLICY of the engines (CPU; default: this process's environment); several: one set of engines each, passes alternate")
    ap.add_argument("--preload", nargs="*", default=None, help="modules the warm workers import (default: numpy, sympy)")
    ap.add_argument("--write", action="store_true", help="put the command, date, machine and table in benchmarks/RESULTS.md (a block of its own)")
    args = ap.parse_args()
    if not Path(args.model).exists():
        raise SystemExit(f"{args.model}: not a folder")
    started = time.time()
    results, variants = anyio.run(main_async, args)
    text = format_block(args, results, variants, started)
    emit(text, block_key(args, ap), args.write, section="rollout")


if __name__ == "__main__":
    main()
