"""In-process doubles of the engine's actors, shipped beside the seam they stand in for (as
httpx ships ``MockTransport``): with them the loop, the ledger, the fleet and learner failover run
in unit tests without Ray, vLLM or torch.distributed, in seconds.

The seam is the actor *handle*: the engine calls ``handle.method.remote(*args)`` and awaits the
result. :func:`local_actor` wraps any object so that its methods answer such calls in the event
loop; :meth:`LocalActor.kill` makes every later call fail the way a dead Ray actor's does.

- :class:`FakeGenerator` implements :class:`~agentrl.engine.common.interfaces.Generator`: it "generates"
  a fixed number of tokens labelled with the version it serves.
- :class:`FakeWorker` plays groups of one-turn episodes on its generators (reward from the row),
  and reports the episodes of a dead generator as infrastructure failures, as the real worker does.
- :class:`FakeLearner` records what it trained; it writes version folders, checkpoints and
  exports as small marker files, so the run-directory logic is the real one.
- :class:`FakeRewardModel` scores every item 0.5; :class:`FakeTokenizer` decodes ids as numbers, so
  that the real :class:`~agentrl.engine.rewards.scoring.EpisodeScorer` judges a fake worker's episodes.
- Hooks for :class:`~agentrl.engine.loop.loop.RLLoop`: :class:`KillGenerator`, :class:`KillLearner`,
  :class:`KillWorker`, :class:`KillRewardActor`.
"""

from __future__ import annotations

import asyncio
import inspect
import json
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
    "KillGenerator",
    "KillLearner",
    "KillRewardActor",
    "KillWorker",
    "LocalActor",
    "local_actor",
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

    def ping(self) -> bool:
        return True

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


class FakeLearner:
    """A learner rank that trains nothing but records it.

    ``trained`` (shared between the ranks and restarts a test creates) receives one entry per
    step on rank 0: ``(step, [sample ids])``. ``step_delay_s`` makes a step take time."""

    def __init__(self, *, rank: int = 0, trained: list[tuple[int, list[str]]] | None = None, step_delay_s: float = 0.0, **_: Any) -> None:
        self.rank = rank
        self.trained = trained if trained is not None else []
        self.step_delay_s = step_delay_s
        self.step = 0

    def setup(self) -> dict[str, Any]:
        return {"rank": self.rank, "fake": True}

    async def train_step(self, samples: list[dict[str, Any]]) -> dict[str, Any]:
        t0 = time.monotonic()
        await asyncio.sleep(self.step_delay_s)
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

    def save_checkpoint(self, folder: str) -> None:
        if self.rank == 0:
            Path(folder).mkdir(parents=True, exist_ok=True)
            (Path(folder) / "trainer_state.json").write_text(json.dumps({"step": self.step}))

    def load_checkpoint(self, folder: str) -> None:
        self.step = json.loads((Path(folder) / "trainer_state.json").read_text())["step"]

    def weight_transfer_endpoint(self) -> tuple[str, int]:
        return "127.0.0.1", 0

    def connect_weight_transfer(self, *args: Any) -> None:
        raise RuntimeError("the fake learner has no weight-transfer group")

    def shutdown(self) -> None:
        return None


class FakeCritic:
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

    def save_checkpoint(self, folder: str) -> None:
        if self.rank == 0:
            Path(folder).mkdir(parents=True, exist_ok=True)
            (Path(folder) / "trainer_state.json").write_text(json.dumps({"step": self.step}))

    def load_checkpoint(self, folder: str) -> None:
        self.step = json.loads((Path(folder) / "trainer_state.json").read_text())["step"]

    def shutdown(self) -> None:
        return None


class KillGenerator:
    """Loop hook: kill generator ``index`` once the learner reached ``after_step`` and groups are
    in flight (as if its node was lost)."""

    def __init__(self, after_step: int, index: int = 0) -> None:
        self.step, self.index = after_step, index
        self.done = False

    async def on_round(self, loop: Any) -> None:
        if not self.done and loop.version >= self.step and loop.pending:
            loop.log.event(f"fault injection: killing generator {self.index} after step {loop.version}")
            kill(loop.fleet.generators[self.index])
            self.done = True

    async def after_step(self, loop: Any) -> None:
        return None


class KillWorker:
    """Loop hook: kill rollout worker ``index`` once the learner reached ``after_step`` and
    groups are in flight (as if its process was SIGKILLed); ``times`` kills in all, each at a
    later step than the one before."""

    def __init__(self, after_step: int, index: int = 0, times: int = 1) -> None:
        self.step, self.index, self.left = after_step, index, times
        self.killed: list[Any] = []
        """The handles killed, in order."""

    async def on_round(self, loop: Any) -> None:
        if self.left and loop.version >= self.step and loop.pending:
            loop.log.event(f"fault injection: killing rollout worker {self.index} after step {loop.version}")
            handle = loop.fleet.workers[self.index]
            kill(handle)
            self.killed.append(handle)
            self.left -= 1
            self.step = loop.version + 1

    async def after_step(self, loop: Any) -> None:
        return None


class KillRewardActor:
    """Loop hook: kill the reward actor ``which`` (``"judge"``: a separate judge's generator
    ``index``; ``"reward_model"``) once the learner reached ``after_step`` and groups are in flight.
    ``handles()``: the actors of that kind (default: the loop's replaceable ones)."""

    def __init__(self, after_step: int, which: str, index: int = 0, handles: Callable[[], list[Any]] | None = None) -> None:
        self.step, self.which, self.index, self.handles = after_step, which, index, handles
        self.killed: list[Any] = []
        """The handles killed."""

    async def on_round(self, loop: Any) -> None:
        if not self.killed and loop.version >= self.step and loop.pending:
            loop.log.event(f"fault injection: killing the {self.which} actor {self.index} after step {loop.version}")
            handle = (self.handles() if self.handles is not None else loop.reward_actors[self.which].slots())[self.index]
            kill(handle)
            self.killed.append(handle)

    async def after_step(self, loop: Any) -> None:
        return None


class KillLearner:
    """Loop hook: kill learner rank ``rank`` (``critic=True``: PPO's critic rank) right after step
    ``after_step`` was logged (so the next step, or the checkpoint after it, finds it dead)."""

    def __init__(self, after_step: int, rank: int = 0, critic: bool = False) -> None:
        self.step, self.rank, self.critic = after_step, rank, critic
        self.done = False

    async def on_round(self, loop: Any) -> None:
        return None

    async def after_step(self, loop: Any) -> None:
        if not self.done and loop.version >= self.step:
            group = loop.critic.group if self.critic else loop.learners
            kill(group.handles[self.rank])
            self.done = True


class FakeRun:
    """The engine's real parts — ledger, staleness queue, fleet, publisher, learner group, loop,
    checkpoints, failover — over the fakes above, in one directory ``root``. For tests::

        run = FakeRun(tmp_path, rows=[{"reward": 1.0}] * 8, max_steps=3)
        loop = asyncio.run(run.run())

    ``worker``: keyword arguments of every :class:`FakeWorker`; ``learner``: of every
    :class:`FakeLearner`; ``critic``: of a :class:`FakeCritic` group, which makes the run PPO's
    (``advantage = "gae"``, with ``critic_warmup`` warm-up steps; None: GRPO); ``state``: a
    checkpoint's run state to resume from (None: the start); ``dynamic_sampling``,
    ``max_sampling_factor``, ``solved_reward``: as the recipe's ``[algo]`` keys (refill sets
    groups without a learning signal aside in the queue); ``worker_restarts``: replace a dead
    rollout worker at most this many times (:mod:`agentrl.engine.loop.rollout_failover`; None:
    no replacement, its groups are only lost); ``colocated``, ``sleep_level``: as
    :class:`~agentrl.engine.loop.loop.LoopSettings` (generators and learner take turns);
    ``judges``: a separate judge's fake generators that score every episode, ``reward_model``: a
    :class:`FakeRewardModel` that does too; ``reward_restarts``: replace a dead one of them at most
    this many times (None: no replacement, :mod:`agentrl.engine.rewards.reward_actors`);
    ``start_model``: the folder RL starts from, for a learner death before the first checkpoint
    (None: such a death is an error).
    """

    def __init__(
        self, root: Path, *, rows: list[dict[str, Any]], batch_size: int = 4, group_size: int = 2, max_staleness: int = 1,
        max_steps: int = 3, num_generators: int = 1, num_workers: int = 1, checkpoint_every: int = 0, max_restarts: int = 0,
        worker: dict[str, Any] | None = None, learner: dict[str, Any] | None = None, hooks: list[Any] | None = None,
        timeout_s: float = 30.0, max_degenerate_steps: int = 0, critic: dict[str, Any] | None = None, critic_warmup: int = 0,
        dynamic_sampling: str = "off", max_sampling_factor: float = 3.0, solved_reward: float = 1.0,
        worker_restarts: int | None = None, colocated: bool = False, sleep_level: int = 0,
        judges: int = 0, reward_model: bool = False, reward_restarts: int | None = 2, start_model: str | None = None,
    ) -> None:
        import functools

        import io

        from rich.console import Console

        from agentrl.engine.loop.batching import BatchSettings, no_signal_reason
        from agentrl.engine.generation.fleet import GeneratorFleet
        from agentrl.engine.generation.generator import EngineSettings
        from agentrl.engine.training.learner_group import LearnerGroup
        from agentrl.engine.loop.loop import LoopSettings
        from agentrl.engine.metrics import MetricsLogger
        from agentrl.engine.loop.publishing import WeightPublisher
        from agentrl.engine.common.run_dir import RunDir

        self.run_dir = RunDir(Path(root))
        self.rows = rows
        self.batch_size, self.group_size, self.max_staleness = batch_size, group_size, max_staleness
        self.num_workers = num_workers
        self.checkpoint_every, self.max_restarts = checkpoint_every, max_restarts
        self.start_model = start_model
        self.worker_kwargs = dict(worker or {})
        from agentrl.engine.rewards.reward_actors import RewardActors

        self.judges, self.with_reward_model, self.reward_restarts = judges, reward_model, reward_restarts
        self.rewards = RewardActors()
        """The fake judge generators and reward model, once started (replacements write here)."""
        self.reward_actors_made = 0
        self.worker_restarts = worker_restarts
        self.workers_made = 0
        self.hooks = list(hooks or [])
        self.console = io.StringIO()
        self.log = MetricsLogger(self.run_dir.root, console=Console(file=self.console, width=200), live=False)
        self.trained: list[tuple[int, list[str]]] = []
        """Every step any fake learner rank 0 took: ``(step, sample ids)`` (restarts included)."""
        self.generators_made = 0
        learner_kwargs = dict(learner or {})

        def make_generator(settings: Any, version: int, index: int) -> LocalActor:
            self.generators_made += 1
            return local_actor(FakeGenerator(version), f"generator {index}")

        self.learners = LearnerGroup(
            num_ranks=1, placement=None, timeout_s=timeout_s,
            factory=lambda rank, kwargs, options: local_actor(FakeLearner(rank=rank, trained=self.trained, **learner_kwargs), f"learner {rank}"),
        )
        self.fleet = GeneratorFleet(
            factory=make_generator, settings=EngineSettings(model=str(root)), count=num_generators, log=self.log,
            timeout_s=timeout_s, startup_timeout_s=timeout_s,
        )
        self.publisher = WeightPublisher(
            fleet=self.fleet, learners=self.learners, run_dir=self.run_dir, log=self.log, weight_sync="disk",
            sync_timeout_s=timeout_s, workers_per_generator=1, dtype="float32", keep_versions=3,
        )
        self.batch = BatchSettings(advantage="grpo" if critic is None else "gae", dynamic_sampling=dynamic_sampling, solved_reward=solved_reward)
        self.queue_kwargs: dict[str, Any] = {} if dynamic_sampling != "refill" else {
            "classify": functools.partial(no_signal_reason, settings=self.batch),
            "refill_groups": int((max_sampling_factor - 1) * (batch_size // group_size)),
        }
        """Refill's arguments of the staleness queue (none without refill), as ``wiring.queue_kwargs`` gives them."""
        self.critic_seen: list[tuple[int, list[str], list[float]]] = []
        """Every step a fake critic rank 0 trained: ``(step, sample ids, returns)``."""
        self.critic = None if critic is None else LearnerGroup(
            num_ranks=1, placement=None, timeout_s=timeout_s, name="critic",
            factory=lambda rank, kwargs, options: local_actor(FakeCritic(rank=rank, seen=self.critic_seen, **critic), f"critic {rank}"),
        )
        self.critic_warmup = critic_warmup
        self.settings = LoopSettings(
            max_steps=max_steps, group_size=group_size, episode_timeout_s=timeout_s, stuck_timeout_s=3 * timeout_s,
            checkpoint_every=checkpoint_every, max_degenerate_steps=max_degenerate_steps,
            colocated=colocated, sleep_level=sleep_level,
        )

    async def start(self, version: int = 0) -> None:
        """Start the fake generators, learner and workers (at weight ``version``)."""
        await self.fleet.start(version)
        await self.learners.start({})
        if self.critic is not None:
            await self.critic.start({})
        self.rewards.judge_generators = [self._spawn_reward_actor(("judge", i)) for i in range(self.judges)]
        self.rewards.reward_model = self._spawn_reward_actor(("reward_model", 0)) if self.with_reward_model else None
        self.fleet.workers = [self._make_worker(i) for i in range(self.num_workers)]

    def _spawn_reward_actor(self, spec: tuple[str, int]) -> LocalActor:
        """A fake reward actor for ``spec`` (``(kind, index)``: this run's stand-in for an ActorSpec)."""
        self.reward_actors_made += 1
        kind, i = spec
        return local_actor(FakeGenerator(0) if kind == "judge" else FakeRewardModel(), f"{kind} {i}")

    def _make_worker(self, index: int) -> LocalActor:
        self.workers_made += 1
        return local_actor(FakeWorker(self.fleet.generators, **self.worker_kwargs, **self.rewards.worker_kwargs()), f"worker {index}")

    async def run(self, state: Any = None) -> Any:
        """Start, then run the loop (with learner failover) from ``state``; the finished loop."""
        from agentrl.engine.loop.checkpointing import RunCheckpointer
        from agentrl.engine.loop.critic_stage import CriticStage, GaeSettings
        from agentrl.engine.loop.failover import LearnerFailover, run_with_failover
        from agentrl.engine.loop.ledger import PromptLedger
        from agentrl.engine.loop.loop import RLLoop
        from agentrl.engine.loop.staleness import StalenessQueue

        await self.start(state.version if state is not None else 0)
        if state is not None:
            await self.learners.call("load_checkpoint", str(self.run_dir.checkpoint(state.version) / "learner"), what="loading the learner checkpoint")
            if self.critic is not None:
                await self.critic.call("load_checkpoint", str(self.run_dir.checkpoint(state.version) / "critic"), what="loading the critic checkpoint")
        checkpointer = RunCheckpointer(run_dir=self.run_dir, learners=self.learners, keep=2, tokenizer=None, log=self.log, critic=self.critic)
        failover = LearnerFailover(
            run_dir=self.run_dir, learners=self.learners, fleet=self.fleet, publisher=self.publisher,
            learner_kwargs=lambda weights: {}, max_restarts=self.max_restarts, log=self.log, critic=self.critic,
            critic_kwargs=lambda: {}, start=self.start_model,
        )
        stage = None if self.critic is None else CriticStage(group=self.critic, settings=GaeSettings(normalize=False, lam=1.0),
                                                            warmup_steps=self.critic_warmup)

        rollout_failover = None
        if self.worker_restarts is not None:
            from agentrl.engine.loop.rollout_failover import RolloutFailover

            async def start_worker(index: int) -> LocalActor:
                return self._make_worker(index)

            rollout_failover = RolloutFailover(workers=lambda: self.fleet.workers, start=start_worker,
                                               max_restarts=self.worker_restarts, log=self.log, ping_timeout_s=5.0)
        reward_slots = {}
        if self.reward_restarts is not None:
            from agentrl.engine.rewards.reward_actors import reward_actor_slots

            reward_slots = reward_actor_slots(
                self.rewards, [("judge", i) for i in range(self.judges)], ("reward_model", 0), workers=lambda: self.fleet.workers,
                log=self.log, judge_max_restarts=self.reward_restarts, rm_max_restarts=self.reward_restarts,
                startup_timeout_s=30.0, probe_timeout_s=5.0, spawn=self._spawn_reward_actor,
            )

        async def run(at: Any) -> RLLoop:
            queue = StalenessQueue(batch_size=self.batch_size, group_size=self.group_size, max_staleness=self.max_staleness,
                                   **self.queue_kwargs)
            kwargs = {"num_rows": len(self.rows), "group_size": self.group_size}
            ledger = PromptLedger.restore(at, queue, **kwargs) if at is not None else PromptLedger(**kwargs)
            loop = RLLoop(
                rows=self.rows, queue=queue, ledger=ledger, fleet=self.fleet, publisher=self.publisher, learners=self.learners,
                batch=self.batch, settings=self.settings, log=self.log, run_dir=self.run_dir, checkpoint=checkpointer.save,
                version=at.version if at is not None else 0, hooks=self.hooks, critic=stage, rollout_failover=rollout_failover,
                reward_actors=reward_slots,
            )
            await loop.run()
            return loop

        try:
            return await run_with_failover(run, failover, state)
        finally:
            self.fleet.cancel_reload()
