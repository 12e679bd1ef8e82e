"""The in-process doubles of the engine's actors (:mod:`agentrl.engine.testing` is where tests
import them from, beside the run that uses them): a local stand-in for a Ray actor handle, fake
generators, a fake rollout worker, fake learner and critic ranks, a fake reward model and tokenizer.

The seam is the actor *handle*: the engine calls ``handle.method.remote(*args)`` and awaits the
result. :func:`local_actor` wraps any object so that its methods answer such calls in the event
loop; :meth:`LocalActor.kill` makes every later call fail the way a dead Ray actor's does.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agentrl.engine.common.cluster import kill
from agentrl.engine.generation.generator import GeneratorCounters
from agentrl.engine.common.interfaces import Generation, Generator
from agentrl.engine.common.run_dir import version_folder
from agentrl.engine.common.trajectory import Trajectory

__all__ = [
    "FakeActorDied",
    "FakeCritic",
    "FakeGenerator",
    "FakeLearner",
    "FakeRewardModel",
    "FakeTokenizer",
    "FakeWorker",
    "local_actor",
    "LocalActor",
    "ScriptedGenerator",
]


class FakeActorDied(Exception):
    """Raised by calls into a killed :class:`LocalActor` (the double of Ray's ActorDiedError);
    ``died_how`` says how it died."""

    def __init__(self, name: str, how: str = "killed by the test (SIGKILL)") -> None:
        super().__init__(f"the actor {name} died: {how}")
        self.died_how = how


class _Method:
    def __init__(self, actor: LocalActor, name: str) -> None:
        self.actor, self.name = actor, name

    def remote(self, *args: Any, **kwargs: Any) -> asyncio.Future:
        """Run the method in the event loop; a future of its result."""
        return asyncio.ensure_future(self.actor._call(self.name, args, kwargs))


class LocalActor:
    """``obj`` behind a Ray-actor-like handle: ``handle.method.remote(...)`` is awaitable."""

    def __init__(self, obj: Any, name: str = "") -> None:
        self.obj = obj
        self.name = name or type(obj).__name__
        self.dead = False

    def __getattr__(self, name: str) -> _Method:
        if name.startswith("_"):
            raise AttributeError(name)
        return _Method(self, name)

    async def _call(self, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if self.dead:
            raise FakeActorDied(self.name)
        result = getattr(self.obj, name)(*args, **kwargs)
        if inspect.isawaitable(result):
            result = await result
        if self.dead:  # it died while the call ran: the caller never sees the result
            raise FakeActorDied(self.name)
        return result

    def kill(self) -> None:
        """Die now: calls in progress and every later call raise FakeActorDied."""
        self.dead = True


def local_actor(obj: Any, name: str = "") -> LocalActor:
    """``obj`` as an in-process actor handle."""
    return LocalActor(obj, name)


class FakeGenerator(GeneratorCounters, Generator):
    """A generator that writes ``tokens`` copies of token 7 (log-prob ``-1.0``) per call, after
    ``delay_s`` seconds, labelled with the version it serves."""

    def __init__(self, version: int = 0, *, tokens: int = 4, delay_s: float = 0.0) -> None:
        super().__init__(version)
        self.tokens = tokens
        self.delay_s = delay_s
        self.loaded: list[tuple[int, str]] = []
        """``(version, path)`` of every update."""
        self.calls: list[tuple[str, int]] = []
        """``("generate", version)``, ``("sleep", level)`` and ``("load", version)``, in call order."""

    async def start(self) -> dict[str, Any]:
        return {"fake": True, "version": self.version}

    async def sleep(self, level: int) -> float:
        self.calls.append(("sleep", level))
        return 0.0

    async def generate(self, prompt_token_ids: list[int], sampling: dict[str, Any]) -> Generation:
        self.calls.append(("generate", self.version))
        with self.busy:
            await asyncio.sleep(self.delay_s)
            n = min(self.tokens, int(sampling.get("max_tokens", self.tokens)))
            self.tokens_generated += n
            return Generation([7] * n, [-1.0] * n, [self.version] * n, "stop")

    async def update_weights(self, version: int, path: str) -> float:
        self.calls.append(("load", version))
        self.loaded.append((version, path))
        self.version = version
        self.update_stalls_s.append(0.0)
        return 0.0

    async def shutdown(self) -> None:
        return None


class ScriptedGenerator(GeneratorCounters, Generator):
    """A generator that writes what ``script(prompt_text, sampling)`` returns, for gateway and
    agent tests: the text's ids (``tokenize(text)``, default the tokenizer's own encoding) and the
    end-of-sequence id, or the text up to and including the first ``stop`` string in it (no EOS,
    ``stop_reason`` that string), cut to ``max_tokens`` (finish ``length``); log-prob ``-0.5`` per token,
    labelled with the version it serves. ``calls`` records ``(prompt_ids, sampling, ids)``."""

    def __init__(self, tokenizer: Any, script: Callable[[str, dict[str, Any]], str], *, version: int = 0,
                 tokenize: Callable[[str], list[int]] | None = None) -> None:
        super().__init__(version)
        self.tokenizer = tokenizer
        self.script = script
        self.tokenize = tokenize or (lambda text: list(tokenizer.encode(text, add_special_tokens=False)))
        self.calls: list[tuple[list[int], dict[str, Any], list[int]]] = []

    async def start(self) -> dict[str, Any]:
        return {"scripted": True}

    async def generate(self, prompt_token_ids: list[int], sampling: dict[str, Any]) -> Generation:
        with self.busy:
            await asyncio.sleep(0)
            text = self.script(self.tokenizer.decode(prompt_token_ids, skip_special_tokens=False), sampling)
            hits = [(text.find(s) + len(s), s) for s in sampling.get("stop") or [] if s in text]
            stop_reason = None
            if hits:  # as vLLM with include_stop_str_in_output: cut after the first stop string, kept
                end, stop_reason = min(hits)
                ids = self.tokenize(text[:end])
            else:
                ids = self.tokenize(text) + [self.tokenizer.eos_token_id]
            limit = int(sampling.get("max_tokens", len(ids)))
            finish = "stop" if len(ids) <= limit else "length"
            ids = ids[:limit]
            self.tokens_generated += len(ids)
            self.calls.append((list(prompt_token_ids), dict(sampling), ids))
            return Generation(ids, [-0.5] * len(ids), [self.version] * len(ids), finish, stop_reason if finish == "stop" else None)

    async def update_weights(self, version: int, path: str) -> float:
        self.version = version
        return 0.0

    async def shutdown(self) -> None:
        return None


class FakeTokenizer:
    """The tokenizer seam of the judge and the scorer: ids decode as space-separated numbers (a
    :class:`FakeGenerator`'s answer "7 7 7 7" is a judge score of 7), a chat is its last message."""

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return " ".join(str(i) for i in ids)

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return [1] * max(1, len(text.split()))

    def apply_chat_template(self, messages: list[dict[str, str]], tokenize: bool = False, add_generation_prompt: bool = False) -> str:
        return messages[-1]["content"]


class FakeRewardModel:
    """The reward model's seam (``ping``, ``score(items)``): every item scores 0.5."""

    def ping(self) -> bool:
        return True

    async def score(self, items: list[Any]) -> list[float]:
        await asyncio.sleep(0)
        return [0.5] * len(items)


class FakeWorker:
    """Plays one-turn episodes: prompt tokens ``[1, 2, 3]``, the generator's tokens, reward
    ``reward(row, sample_index)`` (default: the row's ``"reward"``, else 1.0).

    ``fail(prompt_index, group_id)`` returning True makes the whole group an infrastructure
    failure (as a lost sandbox would); a dead generator does the same to the episodes on it.
    ``delay_s(prompt_index)`` is how long the group runs on after its tokens were generated
    (a tool call, a slow environment). ``judge_generators`` (one per group, in turn) and
    ``reward_model``: handles that score each finished episode through the real
    :class:`~agentrl.engine.rewards.scoring.EpisodeScorer` (judge weight 1, reward model weight 1),
    as the rollout worker does; a scorer that fails makes the episode an infrastructure failure."""

    def __init__(
        self, generators: list[Any], *, reward: Callable[[dict[str, Any], int], float] | None = None,
        fail: Callable[[int, str], bool] | None = None, delay_s: Callable[[int], float] | None = None,
        judge_generators: list[Any] | None = None, reward_model: Any = None,
    ) -> None:
        self.judge_generators = list(judge_generators or [])
        self.reward_model = reward_model
        self._judge_turn = 0
        self.generators = list(generators)
        self.reward = reward or (lambda row, i: float(row.get("reward", 1.0)))
        self.fail = fail or (lambda idx, gid: False)
        self.delay_s = delay_s or (lambda idx: 0.0)
        self.groups: list[str] = []
        """Group ids played, in order."""
        self.episodes: list[Trajectory] = []
        """Every episode played, in order."""
        self._turn = 0
        self.sandbox_replaced = 0
        """What :meth:`sandbox_stats` says as ``workers_replaced`` (a test raises it to play a
        sandbox worker that died and was replaced)."""

    def ping(self) -> bool:
        return True

    def sandbox_stats(self) -> dict[str, int]:
        """As the rollout worker's: a stand-in process id (this object's) and ``workers_replaced``."""
        return {"pid": id(self), "workers_replaced": self.sandbox_replaced}

    def set_generators(self, generators: list[Any]) -> None:
        self.generators = list(generators)

    def set_judge_generators(self, generators: list[Any]) -> None:
        self.judge_generators = list(generators)

    def set_reward_model(self, reward_model: Any) -> None:
        self.reward_model = reward_model

    def _scorer(self) -> Any:
        """The group's scorer (None without a judge or a reward model), as the rollout worker makes it."""
        if not self.judge_generators and self.reward_model is None:
            return None
        from agentrl.engine.rewards.judge import JudgeSettings, LLMJudge
        from agentrl.engine.rewards.scoring import EpisodeScorer, RewardSettings

        tok = FakeTokenizer()
        judge = None
        if self.judge_generators:
            gen = self.judge_generators[self._judge_turn % len(self.judge_generators)]
            self._judge_turn += 1
            judge = LLMJudge(JudgeSettings(template="{response}", score_pattern=r"(\d+)", timeout_s=10.0), tok, gen.generate.remote)
        return EpisodeScorer(RewardSettings(judge_weight=1.0, rm_weight=1.0, rm_timeout_s=10.0), tokenizer=tok, judge=judge,
                             reward_model=self.reward_model)

    async def run_group(
        self, row: dict[str, Any], prompt_index: int, group_id: str, n: int, sampling: dict[str, Any] | None = None,
        score: bool = True,
    ) -> list[Trajectory]:
        self.groups.append(group_id)
        gen = self.generators[self._turn % len(self.generators)]
        self._turn += 1
        scorer = self._scorer() if score else None
        out = []
        for i in range(n):
            status, error = "ok", ""
            try:
                g: Generation = await gen.generate.remote([1, 2, 3], {"max_tokens": 16, **(sampling or {})})
            except Exception as exc:  # noqa: BLE001 - the generator is gone
                status, error = "infra_failure", f"GeneratorError: {exc}"
                g = Generation([], [], [], "abort")
            if self.fail(prompt_index, group_id):
                status, error = "infra_failure", "SandboxError: injected"
            m = len(g.token_ids)
            out.append(Trajectory(
                tokens=[1, 2, 3, *g.token_ids], loss_mask=[0, 0, 0] + [1] * m, behaviour_logprobs=[0.0] * 3 + g.logprobs,
                versions=[-1] * 3 + g.versions, reward=self.reward(row, i) if status == "ok" else 0.0, group_id=group_id,
                sample_index=i, prompt_index=prompt_index, status=status, metrics={"turns": 1},
                info={"error": error} if error else {},
            ))
        await asyncio.sleep(self.delay_s(prompt_index))
        if scorer is not None:  # the finished episodes are scored, as the rollout worker does
            await asyncio.gather(*[scorer.score(t, row) for t in out])
        self.episodes.extend(out)
        return out

    async def shutdown(self) -> None:
        return None


class _StepCheckpoints:
    """What the fake ranks share: a checkpoint holds the step (written by rank 0), in place on
    return, or with ``background`` written into a hidden sibling and put in place as the real
    ranks do: ``background_write_s`` seconds later (the write's time), or, when that is None (a
    disk slower than the next step), at ``finish_checkpoint``. Shutting down does nothing."""

    rank: int
    step: int
    background_write_s: float | None = None
    _pending_checkpoint: tuple[Path, Path, threading.Timer | None] | None = None

    def save_checkpoint(self, folder: str, background: bool = False) -> None:
        self.finish_checkpoint()
        final = Path(folder)
        target = final.with_name(f".{final.name}.tmp") if background else final
        if self.rank == 0:
            target.mkdir(parents=True, exist_ok=True)
            (target / "trainer_state.json").write_text(json.dumps({"step": self.step}))
        if background:
            timer = None
            if self.rank == 0 and self.background_write_s is not None:
                timer = threading.Timer(self.background_write_s, os.replace, (target, final))
                timer.start()
            self._pending_checkpoint = (target, final, timer)

    def finish_checkpoint(self) -> dict[str, Any] | None:
        pending, self._pending_checkpoint = self._pending_checkpoint, None
        if pending is None:
            return None
        target, final, timer = pending
        if timer is not None:
            timer.join()
        if self.rank == 0 and target.exists():
            os.replace(target, final)
        return {"path": str(final), "wait_s": 0.0}

    def load_checkpoint(self, folder: str) -> None:
        self._pending_checkpoint = None
        self.step = json.loads((Path(folder) / "trainer_state.json").read_text())["step"]

    def shutdown(self) -> None:
        return None


class FakeLearner(_StepCheckpoints):
    """A learner rank that trains nothing but records it.

    ``trained`` (shared between the ranks and restarts a test creates) receives one entry per
    step on rank 0: ``(step, [sample ids])``. ``step_delay_s`` makes a step take time;
    ``background_write_s``: a background checkpoint's write time (None: it ends at
    ``finish_checkpoint``, see :class:`_StepCheckpoints`)."""

    def __init__(self, *, rank: int = 0, trained: list[tuple[int, list[str]]] | None = None, step_delay_s: float = 0.0,
                 background_write_s: float | None = None, **_: Any) -> None:
        self.rank = rank
        self.background_write_s = background_write_s
        self.trained = trained if trained is not None else []
        self.step_delay_s = step_delay_s
        self.step = 0
        self.offloaded = False

    def offload_states(self) -> float:
        """Colocated offload: recorded in ``trained`` on rank 0 as ``(step, ["offloaded"])``."""
        if self.rank == 0 and not self.offloaded:
            self.trained.append((self.step, ["offloaded"]))
        self.offloaded = True
        return 0.0

    def setup(self) -> dict[str, Any]:
        return {"rank": self.rank, "fake": True}

    async def train_step(self, samples: list[dict[str, Any]]) -> dict[str, Any]:
        t0 = time.monotonic()
        await asyncio.sleep(self.step_delay_s)
        self.offloaded = False  # a real rank brings its states back first
        self.step += 1
        if self.rank == 0:
            self.trained.append((self.step, [s["id"] for s in samples]))
        return {"step": self.step, "trained_tokens": sum(sum(s["loss_mask"]) for s in samples), "loss": 0.0, "lr": 0.0,
                "train_s": time.monotonic() - t0}

    async def hold_step(self) -> dict[str, Any]:
        """A critic warm-up step: the version advances, nothing is trained (recorded as ``held``)."""
        await asyncio.sleep(self.step_delay_s)
        self.step += 1
        if self.rank == 0:
            self.trained.append((self.step, ["held"]))
        return {"step": self.step, "trained_tokens": 0.0, "lr": 0.0, "policy_held": 1.0}

    def sft_step(self, batch: list[dict[str, Any]]) -> dict[str, Any]:
        self.step += 1
        return {"step": self.step, "trained_tokens": sum(len(b["tokens"]) for b in batch), "sft_loss": 0.0, "lr": 0.0}

    def publish(self, out_dir: str, with_tokenizer: bool = False, serving_dtype: bool = False, merged: bool = False) -> str | None:
        if self.rank != 0:
            return None
        Path(out_dir).mkdir(parents=True, exist_ok=True)
        (Path(out_dir) / "config.json").write_text(json.dumps({"fake_step": self.step}))
        return out_dir

    def publish_version(self, weights_dir: str) -> int:
        self.publish(str(version_folder(weights_dir, self.step)))
        return self.step

    def weight_transfer_endpoint(self) -> tuple[str, int]:
        return "127.0.0.1", 0

    def connect_weight_transfer(self, *args: Any) -> None:
        raise RuntimeError("the fake learner has no weight-transfer group")


class FakeCritic(_StepCheckpoints):
    """A critic rank that values every action token at ``value`` and records what it trained on.

    ``seen`` (shared like :class:`FakeLearner`'s ``trained``) receives, per training step on rank
    0, ``(step, [sample ids], every action token's return)``; checkpoints hold the step."""

    def __init__(self, *, rank: int = 0, value: float = 0.25, seen: list[tuple[int, list[str], list[float]]] | None = None, **_: Any) -> None:
        self.rank, self.value = rank, value
        self.seen = seen if seen is not None else []
        self.step = 0

    def setup(self) -> dict[str, Any]:
        return {"rank": self.rank, "fake": True}

    def values(self, samples: list[dict[str, Any]]) -> list[list[float]]:
        return [[self.value if m else 0.0 for m in s["loss_mask"]] for s in samples]

    def train_step(self, samples: list[dict[str, Any]]) -> dict[str, Any]:
        self.step += 1
        if self.rank == 0:
            returns = [r for s in samples for r, m in zip(s["returns"], s["loss_mask"]) if m]
            self.seen.append((self.step, [s["id"] for s in samples], returns))
        return {"value_loss": 0.0, "value_mse": 0.0, "value_tokens": float(sum(sum(s["loss_mask"]) for s in samples))}

