"""Agent episodes through the gateway against the same task as an environment, in one run.

The task is Calc with a Python tool through function calling, played two ways on the same vLLM
engine, sandbox, model, rows and sampling seeds:

- *gateway*: :func:`agentrl.envs.calc_agent.calc_agent`, an OpenAI-SDK agent, through
  :func:`agentrl.engine.episodes.agent_episode.play_agent_episode`: every model call is an HTTP request to
  the gateway (JSON, message matching, template rendering of the new messages, tool-call parsing,
  the SDK's own parsing of the answer);
- *env*: :class:`MirrorEnv`, a ``TextEnv`` that shows the model exactly the same text (the system
  turn holds the same ``<tools>`` block the chat template writes, tool output comes back as a
  ``tool`` message, the answer is scored the same way), played by
  :func:`agentrl.engine.episodes.env_episode.play_episode`, token in/token out with no HTTP at all.

Both passes sample every turn of episode ``i`` with the same seed (``episode_seed(0, i, 0, turn)``),
so they can generate the same tokens: the benchmark compares the generated token ids episode by
episode (not only their counts) and reports in how many episodes the gateway wrote exactly the env
pass's ids, beside how many the env pass reproduced of its own first repeat (the engine's own
run-to-run determinism under different batching, the ceiling of the first figure). Also: generated
tokens/s of each pass, median over ``--repeats`` alternating passes, and their ratio.

    .venv/bin/python benchmarks/agent_gateway.py --model runs/tiny_agent/sft --episodes 128 --concurrency 32 --repeats 5 --write

The model should be one that calls the tool in this format (the SFT stage of
``recipes/tiny_agent.toml``), so that episodes are multi-turn.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from pathlib import Path
from typing import Any

from _measure import busy_cpu_s, emit, run_header


def mirror_env_class() -> type:
    """:class:`MirrorEnv`, defined on first use (the envs package is imported lazily)."""
    from agentrl.agents import PYTHON_TOOL
    from agentrl.envs.base import TextEnv
    from agentrl.envs.calc_agent import MAX_CALLS, SYSTEM_PROMPT, score
    from agentrl.envs.parsers import HermesParser

    system = f"{SYSTEM_PROMPT}\n<tools>\n{json.dumps(PYTHON_TOOL['function'])}\n</tools>"

    class MirrorEnv(TextEnv):
        """The calc agent as an environment: same prompt text, same tool, same reward."""

        def __init__(self, sandbox: Any) -> None:
            super().__init__()
            self.sandbox = sandbox
            self.parser = HermesParser()

        def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[list[dict], dict]:
            self.row = (options or {})["row"]
            self.turn = 0
            return [{"role": "system", "content": system}, {"role": "user", "content": self.row["question"]}], {}

        def step(self, action: str) -> Any:
            raise NotImplementedError("MirrorEnv is asynchronous: use astep")

        async def astep(self, action: str) -> tuple[list[dict], float, bool, bool, dict]:
            from agentrl.agents import episode_sandbox, run_code

            self.turn += 1
            calls = [c for c in self.parser.parse(action) if c.error is None]
            if not calls or self.turn >= MAX_CALLS:
                content = action.split("<tool_call>")[0]
                return [], score(content, self.row), True, False, {"tool_calls": 0}
            token = episode_sandbox.set(self.sandbox)
            try:
                outputs = [await run_code(str(c.arguments.get("code", ""))) for c in calls]
            finally:
                episode_sandbox.reset(token)
            return [{"role": "tool", "content": out} for out in outputs], 0.0, False, False, {"tool_calls": len(calls)}

    return MirrorEnv


SEED = 0
"""The run seed both passes derive every turn's sampling seed from."""


def generated_ids(traj: Any) -> list[int]:
    """The ids the model wrote in an episode, in order (the loss-mask-1 tokens, over all segments)."""
    return [t for t, m in zip(traj.tokens, traj.loss_mask) if m]


def same_ids(a: list[Any], b: list[Any]) -> int:
    """In how many episodes (same row, same index) ``a`` and ``b`` generated identical token ids (an
    episode where neither generated anything does not count as a match)."""
    assert len(a) == len(b) and all(x.prompt_index == y.prompt_index for x, y in zip(a, b))
    return sum(bool(generated_ids(x)) and generated_ids(x) == generated_ids(y) for x, y in zip(a, b))


async def env_pass(gen: Any, tok: Any, rows: list[dict], concurrency: int, sandbox: Any) -> tuple[float, list[Any]]:
    from agentrl.engine.episodes.env_episode import play_episode

    env_cls = mirror_env_class()
    sem = asyncio.Semaphore(concurrency)

    async def one(i: int) -> Any:
        async with sem:
            return await play_episode(
                env_cls(sandbox), tok, gen.generate, row=rows[i], group_id=f"g{i}", prompt_index=i, sample_index=0, seed=SEED,
                sampling={"temperature": 1.0}, max_new_tokens=64, max_episode_tokens=512, max_turns=3, seed_sampling=True,
            )

    t0 = time.monotonic()
    out = await asyncio.gather(*[one(i) for i in range(len(rows))])
    return time.monotonic() - t0, out


async def gateway_pass(gen: Any, tok: Any, rows: list[dict], concurrency: int, sandbox: Any) -> tuple[float, list[Any]]:
    from agentrl.engine.episodes.agent_episode import play_agent_episode
    from agentrl.engine.episodes.gateway import Gateway, new_http_client
    from agentrl.engine.episodes.env_episode import episode_seed
    from agentrl.envs.calc_agent import calc_agent

    gateway = Gateway(tok)
    await gateway.start()
    sem = asyncio.Semaphore(concurrency)

    async def one(i: int, http: Any) -> Any:
        async with sem:
            return await play_agent_episode(
                calc_agent, gateway, gen.generate, http_client=http, row=rows[i], group_id=f"g{i}", prompt_index=i, sample_index=0,
                defaults={"temperature": 1.0}, max_new_tokens=64, max_episode_tokens=512, max_calls=3, timeout_s=300.0,
                sandbox=sandbox, seed_of=lambda call, choice, i=i: episode_seed(SEED, i, 0, call),  # the env pass's seeds
            )

    try:
        async with new_http_client() as http:
            t0 = time.monotonic()
            out = await asyncio.gather(*[one(i, http) for i in range(len(rows))])
            return time.monotonic() - t0, out
    finally:
        await gateway.aclose()


async def call_costs(tok: Any, calls: int) -> dict[str, float]:
    """CPU milliseconds per sequential ``chat.completions.create`` with no model: through the
    gateway (a scripted generator answers at once: what the gateway itself costs, rendering and
    recording included), and against a bare aiohttp handler that returns a canned answer (the
    floor: the SDK and HTTP on both ends)."""
    import socket

    import openai
    from aiohttp import web

    from agentrl.agents import MODEL, PYTHON_TOOL
    from agentrl.engine.episodes.chat_segments import ChatRecorder
    from agentrl.engine.episodes.gateway import Gateway, Session, new_http_client
    from agentrl.engine.testing import ScriptedGenerator

    messages = [{"role": "system", "content": "Compute with the python tool."}, {"role": "user", "content": "Compute 1+2."}]
    out: dict[str, float] = {}
    async with new_http_client() as http:
        gateway = Gateway(tok)
        await gateway.start()
        gen = ScriptedGenerator(tok, lambda prompt, sampling: "\\boxed{3}")
        url = gateway.open(Session(recorder=ChatRecorder(tok), generate=gen.generate, defaults={}, max_new_tokens=32,
                                   max_context_tokens=512, max_calls=10 * calls))
        client = openai.AsyncOpenAI(base_url=url, api_key=gateway.api_key, max_retries=0, http_client=http)
        raw = await client.chat.completions.with_raw_response.create(model=MODEL, messages=messages, tools=[PYTHON_TOOL])
        canned = raw.http_response.json()

        async def answer(request: Any) -> Any:
            await request.json()
            return web.json_response(canned)

        app = web.Application()
        app.router.add_post("/v1/chat/completions", answer)
        runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await runner.setup()
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        await web.SockSite(runner, sock).start()
        bare = openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{sock.getsockname()[1]}/v1", api_key="k", max_retries=0, http_client=http)
        try:
            for name, c in (("gateway", client), ("floor", bare)):
                for _ in range(20):  # warm-up
                    await c.chat.completions.create(model=MODEL, messages=messages, tools=[PYTHON_TOOL])
                t0 = time.process_time()
                for _ in range(calls):
                    await c.chat.completions.create(model=MODEL, messages=messages, tools=[PYTHON_TOOL])
                out[name] = (time.process_time() - t0) / calls * 1e3
        finally:
            await runner.cleanup()
            await gateway.aclose()
    return out


class RemoteGenerator:
    """A generator Ray actor called as a local object (what a rollout worker does with its handles)."""

    def __init__(self, handle: Any) -> None:
        self.handle = handle

    async def start(self) -> Any:
        return await self.handle.start.remote()

    async def generate(self, ids: list[int], sampling: dict[str, Any]) -> Any:
        return await self.handle.generate.remote(ids, sampling)

    async def shutdown(self) -> None:
        await self.handle.shutdown.remote()


async def main_async(args: argparse.Namespace) -> list[dict[str, Any]]:
    from agentrl.engine.generation.generator import EngineSettings, VllmGenerator
    from agentrl.envs.data import load_rows
    from agentrl.models.loading import load_tokenizer
    from agentrl.sandbox import create_sandbox

    tok = load_tokenizer(args.model)
    rows = load_rows("synthetic:calc", limit=args.episodes, seed=123)
    sandbox = create_sandbox("bubblewrap", max_concurrency=args.sandbox_concurrency, timeout_s=5.0, memory_mb=256, preload=[])
    await sandbox.start()
    settings = EngineSettings(model=args.model, max_model_len=1024, kv_cache_gib=0.5, cpu_threads_bind=args.bind)
    if args.generator == "actor":  # as `agentrl train` places it: vLLM in its own process, called through Ray
        from agentrl.engine.common.cluster import new_actor, start_ray, stop_ray
        from agentrl.engine.wiring import ACTOR_ENV_VARS

        start_ray({"num_cpus": 4, "include_dashboard": False, "log_to_driver": False})
        gen = RemoteGenerator(new_actor(VllmGenerator, {"num_cpus": 1, "runtime_env": {"env_vars": ACTOR_ENV_VARS}}, settings))
    else:
        gen = VllmGenerator(settings)
    await gen.start()
    passes = {"env": env_pass, "gateway": gateway_pass}
    results: list[dict[str, Any]] = [{"pass": "calls", **(await call_costs(tok, 300))}]
    first_env: list[Any] | None = None
    try:
        for fn in passes.values():  # untimed warm-up of both paths
            await fn(gen, tok, rows[:16], 8, sandbox)
        for r in range(args.repeats):
            order = list(passes.items()) if r % 2 == 0 else list(passes.items())[::-1]
            repeat: dict[str, list[Any]] = {}
            for name, fn in order:
                cpu0 = busy_cpu_s()
                wall, trajs = await fn(gen, tok, rows, args.concurrency, sandbox)
                cpu = busy_cpu_s() - cpu0
                repeat[name] = trajs
                tokens = sum(t.num_generated for t in trajs)
                results.append({
                    "pass": name, "repeat": r, "tokens_per_s": tokens / wall, "tokens": tokens, "wall_s": wall, "busy_cores": cpu / wall,
                    "turns": statistics.mean(t.metrics["turns"] for t in trajs),
                    "reward": statistics.mean(t.reward for t in trajs),
                    "failures": sum(not t.trainable for t in trajs),
                })
            first_env = first_env or repeat["env"]
            # the token ids themselves, episode by episode: the gateway against this repeat's env pass,
            # and the env pass against its own first repeat (how deterministic the engine is here)
            results.append({"pass": "ids", "repeat": r, "episodes": len(rows),
                            "gateway_same_as_env": same_ids(repeat["gateway"], repeat["env"]),
                            "env_same_as_first_env": same_ids(repeat["env"], first_env)})
    finally:
        await gen.shutdown()
        await sandbox.aclose()
        if args.generator == "actor":
            stop_ray()
    return results


def format_block(args: argparse.Namespace, results: list[dict[str, Any]], started: float) -> str:
    def med(name: str, key: str) -> float:
        return statistics.median(r[key] for r in results if r["pass"] == name)

    head = (
        f"{run_header(started)}. Calc through function calling, {args.episodes} episodes per pass at concurrency "
        f"{args.concurrency}, {args.repeats} repeats alternating the order (medians), model `{args.model}`, one vLLM engine "
        f"({'in a Ray actor, as in a run' if args.generator == 'actor' else 'in the episodes process'}), "
        "bubblewrap sandbox. *gateway*: the OpenAI-SDK agent `calc_agent` through the gateway; *env*: the same prompts, "
        "tool and reward as a `TextEnv`, token in/token out."
    )
    lines = ["| pass | generated tok/s | tokens | wall s | busy cores | turns/episode | reward | failures |", "|---|---|---|---|---|---|---|---|"]
    for name in ("env", "gateway"):
        lines.append(
            f"| {name} | {med(name, 'tokens_per_s'):.0f} | {med(name, 'tokens'):.0f} | {med(name, 'wall_s'):.2f} | "
            f"{med(name, 'busy_cores'):.2f} | {med(name, 'turns'):.2f} | {med(name, 'reward'):.3f} | {med(name, 'failures'):.0f} |"
        )
    ratios = [g["tokens_per_s"] / e["tokens_per_s"] for e, g in zip(
        [r for r in results if r["pass"] == "env"], [r for r in results if r["pass"] == "gateway"])]
    lines.append("")
    lines.append(f"gateway / env tokens/s: median **{statistics.median(ratios):.2f}** (per repeat: {', '.join(f'{x:.2f}' for x in ratios)})")
    ids = [r for r in results if r["pass"] == "ids"]
    n = ids[0]["episodes"]
    same = [r["gateway_same_as_env"] for r in ids]
    lines.append("")
    lines.append(
        f"Generated token ids compared episode by episode (same rows, same per-turn seeds): the gateway wrote exactly "
        f"the env pass's ids in **{min(same)} of {n}** episodes in its worst repeat (per repeat: {', '.join(map(str, same))}); "
        f"the env pass reproduced its own first repeat's ids in {', '.join(str(r['env_same_as_first_env']) for r in ids[1:]) or '-'} of {n}."
    )
    costs = next(r for r in results if r["pass"] == "calls")
    lines.append("")
    lines.append(
        f"CPU per call with no model (300 sequential calls): {costs['gateway']:.2f} ms through the gateway, "
        f"{costs['floor']:.2f} ms of which is the floor (the SDK against a bare aiohttp handler with a canned answer)."
    )
    return head + "\n\n" + "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, help="a Hugging Face folder that calls tools in Hermes form (tiny_agent's SFT stage)")
    ap.add_argument("--episodes", type=int, default=128)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--bind", default="0-1", help="VLLM_CPU_OMP_THREADS_BIND")
    ap.add_argument("--generator", default="actor", choices=["actor", "inprocess"],
                    help="vLLM in a Ray actor, as in a run (default), or in this process, sharing the episodes' event loop")
    ap.add_argument("--sandbox-concurrency", type=int, default=8, help="bubblewrap workers")
    ap.add_argument("--write", action="store_true", help="put the command, date, machine and table in benchmarks/RESULTS.md")
    args = ap.parse_args()
    started = time.time()
    results = asyncio.run(main_async(args))
    key = f"agent-gateway {Path(args.model).name} episodes={args.episodes} concurrency={args.concurrency} generator={args.generator}"
    emit(format_block(args, results, started), key, args.write, section="agent gateway")


if __name__ == "__main__":
    main()
