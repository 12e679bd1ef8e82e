"""The base class of agentrl environments: text in, chat messages out.

A :class:`TextEnv` is a :class:`gymnasium.Env` whose **observations are lists of chat messages**
and whose **action is the model's text for one turn**::

    env = gymnasium.make("agentrl/Calc-v0")
    messages, info = env.reset(seed=0, options={"row": {"question": "Compute 347*58+91.", "answer": "20217"}})
    # messages == [{"role": "system", "content": ...}, {"role": "user", "content": "Compute 347*58+91."}]
    new_messages, reward, terminated, truncated, info = env.step("<code>print(347*58+91)</code>")
    # new_messages == [{"role": "tool", "content": "<interpreter>\\n20217\\n</interpreter>"}]

The caller owns the conversation: it appends the assistant's action and then the returned new
messages, and renders the whole with the model's chat template.

Sync and async. Subclasses implement ``async astep(action)``; :meth:`TextEnv.step` runs it with
``anyio.run`` when no event loop is running in the calling thread (so ``gymnasium.utils.env_checker.check_env``
and plain scripts work) and refuses to run inside one. The engine awaits ``env.unwrapped.astep``
directly, on asyncio or trio. A subclass that is naturally synchronous may override ``step``
instead; the base ``astep`` then runs that ``step`` in a worker thread.
"""

from __future__ import annotations

import copy
import string
import warnings
from typing import Any, ClassVar, Literal, TypedDict

import anyio
import gymnasium
import sniffio
from gymnasium import spaces

from agentrl.errors import DataError, EnvError

__all__ = [
    "Message",
    "Status",
    "StepResult",
    "TextEnv",
    "ChatMessages",
    "AnyText",
    "MAX_CHARS",
]


class Message(TypedDict):
    """One chat message: ``role`` is ``"system"``, ``"user"``, ``"assistant"`` or ``"tool"``;
    ``content`` is its text."""

    role: str
    content: str


Status = Literal["ok", "truncated", "infra_failure", "malformed"]
"""``info["status"]`` of a step; see :class:`TextEnv`."""

StepResult = tuple[list[Message], float, bool, bool, dict[str, Any]]
"""``(new_messages, reward, terminated, truncated, info)`` as returned by ``step``/``astep``."""

MAX_CHARS = 1 << 20
"""Longest text (message content, action) the declared spaces contain: 1 Mi characters."""


class AnyText(spaces.Text):
    """A :class:`gymnasium.spaces.Text` that contains **every** ``str`` of at most ``max_length``
    characters, Unicode included.

    A plain ``Text`` space contains only strings over its finite ``charset``, but a model's action
    and a tool's output may hold any character. Membership is therefore by length only; samples
    are drawn, as in ``Text``, from ``charset`` (default: ASCII printable characters, which
    include space, tab and newlines).
    """

    def __init__(
        self,
        max_length: int = MAX_CHARS,
        *,
        min_length: int = 0,
        charset: str = string.printable,
        seed: int | None = None,
    ) -> None:
        super().__init__(max_length, min_length=min_length, charset=charset, seed=seed)

    def contains(self, x: Any) -> bool:
        """True for any ``str`` whose length is within ``[min_length, max_length]``."""
        return isinstance(x, str) and self.min_length <= len(x) <= self.max_length

    def __repr__(self) -> str:
        return f"AnyText({self.min_length}, {self.max_length})"


class ChatMessages(spaces.Sequence):
    """The space of chat-message lists: a :class:`gymnasium.spaces.Sequence` of
    ``Dict(role=Text(lowercase letters), content=AnyText())``.

    A plain unstacked ``Sequence`` contains only *tuples*; observations of a :class:`TextEnv` are
    *lists* (what chat templates and the OpenAI message format use), so this space contains lists
    as well as tuples, and :meth:`sample` returns a list.
    """

    def __init__(self, seed: int | None = None) -> None:
        message = spaces.Dict(
            {
                "role": spaces.Text(32, min_length=1, charset=string.ascii_lowercase + "_"),
                "content": AnyText(),
            }
        )
        super().__init__(message, seed=seed, stack=False)

    def contains(self, x: Any) -> bool:
        """True for a list or tuple whose items are ``{"role": str, "content": str}`` dicts."""
        return isinstance(x, (list, tuple)) and all(self.feature_space.contains(m) for m in x)

    def sample(self, mask: Any = None, probability: Any = None) -> list[dict[str, str]]:  # type: ignore[override]
        """A random list of random messages (see :meth:`gymnasium.spaces.Sequence.sample`)."""
        return list(super().sample(mask=mask, probability=probability))

    def __repr__(self) -> str:
        return "ChatMessages()"


def _in_event_loop() -> str | None:
    """The name of the async library running in this thread ("asyncio", "trio"), or None."""
    try:
        return sniffio.current_async_library()
    except sniffio.AsyncLibraryNotFoundError:
        return None


class TextEnv(gymnasium.Env[list[Message], str]):
    """A multi-turn text environment: observations are chat messages, actions are model text.

    **Observation** — a ``list`` of messages ``{"role": str, "content": str}`` (see :class:`Message`),
    always a new list of new dicts:

    - from :meth:`reset`: the initial conversation, e.g. ``[system, user]``;
    - from :meth:`step`: only the **new** messages to append after the assistant's action, e.g.
      ``[{"role": "tool", "content": ...}]``; ``[]`` when the episode ends without new messages.

    **Action** — ``str``: everything the model wrote in this turn (tool-call tags included,
    special tokens excluded).

    **Reward** — ``float``: the reward for this step. Rule-based environments give it on the last
    step and ``0.0`` before. When ``info["infra_failure"]`` is true the reward is ``0.0`` and
    **meaningless**: the episode must be discarded, not scored.

    **terminated** — the episode reached its natural end (e.g. the model gave its final answer).

    **truncated** — the episode was cut off before its natural end: the turn limit was reached,
    or the infrastructure failed (then ``info["infra_failure"]`` is true).

    **info** — a new ``dict`` with at least these keys, from ``reset`` and from every ``step``:

    - ``"status"``: what happened in this step —
      ``"ok"`` (a normal step, or a normal end of the episode),
      ``"truncated"`` (the turn limit was reached),
      ``"infra_failure"`` (a sandbox or other infrastructure failed: discard the episode),
      ``"malformed"`` (the action held a malformed tool call; the environment answered with
      feedback and the episode goes on). A step that **ends** the episode has status ``"ok"``,
      ``"truncated"`` or ``"infra_failure"`` (the engine turns it into the trajectory's status);
    - ``"infra_failure"``: ``bool``, true iff ``status == "infra_failure"``; then ``"error"``
      (``str``) says what failed;
    - ``"tool_calls"``: ``int``, tool calls the model made so far in this episode (well formed or not);
    - ``"tool_errors"``: ``int``, how many of those failed (malformed call, code that raised,
      timed out or ran out of memory).

    Environments may add keys; :class:`~agentrl.envs.tool_env.ToolEnv` adds ``"end_reason"`` to
    the step that ends an episode.

    **reset(seed=None, options=None)** — ``options["row"]`` is the dataset row (a ``dict``) the
    episode is about. Without it the environment draws a row with its own seeded RNG
    (:meth:`sample_row`), or raises :class:`~agentrl.errors.EnvError` if it cannot.

    **Subclasses** implement :meth:`initial_messages` and ``async`` :meth:`astep` (or a sync
    ``step``), and may implement :meth:`sample_row` and :meth:`aclose`. They keep the counters
    :attr:`turn`, :attr:`tool_calls` and :attr:`tool_errors` (reset here) and build ``info`` with
    :meth:`make_info`.
    """

    metadata: ClassVar[dict[str, Any]] = {"render_modes": []}
    required_fields: ClassVar[tuple[str, ...]] = ()
    """Keys every ``options["row"]`` must hold; a missing one is a :class:`~agentrl.errors.DataError`."""

    def __init__(self) -> None:
        self.observation_space = ChatMessages()
        self.action_space = AnyText()
        self.row: dict[str, Any] | None = None
        """The dataset row of the current episode (None before the first reset)."""
        self.turn = 0
        """Actions taken in the current episode."""
        self.tool_calls = 0
        self.tool_errors = 0
        self.done = False
        """True once a step returned ``terminated`` or ``truncated``; ``step`` then raises until ``reset``."""

    # ---------------------------------------------------------------- reset

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[list[Message], dict[str, Any]]:
        """Start an episode; return ``(initial_messages, info)``.

        Args:
            seed: seeds :attr:`np_random` (used only when a row must be drawn); None keeps the RNG.
            options: ``{"row": dict}``, the dataset row of this episode. Optional when the
                environment can draw rows itself (:meth:`sample_row`).

        Raises:
            DataError: the row is not a dict or lacks one of :attr:`required_fields`.
            EnvError: no row was given and the environment cannot draw one.
        """
        super().reset(seed=seed)
        row = (options or {}).get("row")
        if row is None:
            row = self.sample_row()
        if not isinstance(row, dict):
            raise DataError(f"{type(self).__name__}.reset: options['row'] must be a dict, got {type(row).__name__}")
        missing = [k for k in self.required_fields if row.get(k) is None]
        if missing:
            raise DataError(f"{type(self).__name__}.reset: the row has no field {missing[0]!r} (keys: {sorted(row)})")
        self.row = dict(row)
        self.turn = self.tool_calls = self.tool_errors = 0
        self.done = False
        return copy.deepcopy(self.initial_messages(self.row)), self.make_info("ok")

    def initial_messages(self, row: dict[str, Any]) -> list[Message]:
        """The conversation an episode about ``row`` starts with (e.g. system + user)."""
        raise NotImplementedError

    def sample_row(self) -> dict[str, Any]:
        """Draw a row with :attr:`np_random` when ``reset`` got none. Default: raise EnvError."""
        raise EnvError(f"{type(self).__name__}.reset needs options={{'row': {{...}}}} (a dataset row)")

    # ---------------------------------------------------------------- step

    async def astep(self, action: str) -> StepResult:
        """Take one turn: ``action`` is the model's text; return ``(new_messages, reward,
        terminated, truncated, info)`` with the meanings given in the class docstring.

        Subclasses implement this. The default runs a subclass's own sync ``step`` in a worker thread.
        """
        if type(self).step is TextEnv.step:
            raise NotImplementedError(f"{type(self).__name__} implements neither astep nor step")
        return await anyio.to_thread.run_sync(self.step, action)

    def step(self, action: str) -> StepResult:
        """Synchronous :meth:`astep`: runs it with ``anyio.run`` (a fresh asyncio loop), then
        :meth:`aclose` in that same loop, since async resources cannot outlive it.

        Raises:
            EnvError: called from a thread that is running an event loop (``await astep`` there).
        """
        if type(self).astep is TextEnv.astep:
            raise NotImplementedError(f"{type(self).__name__} implements neither astep nor step")
        running = _in_event_loop()
        if running is not None:
            raise EnvError(
                f"{type(self).__name__}.step() called inside a running {running} event loop; "
                "use `await env.unwrapped.astep(action)` there"
            )

        async def once() -> StepResult:
            try:
                return await self.astep(action)
            finally:
                await self.aclose()

        return anyio.run(once)

    def start_turn(self) -> None:
        """Count a new turn; call first in ``astep``. Raises EnvError before ``reset`` or after the end."""
        if self.row is None:
            raise EnvError(f"{type(self).__name__}.step() called before reset()")
        if self.done:
            raise EnvError(f"{type(self).__name__}.step() called after the episode ended; call reset()")
        self.turn += 1

    def make_info(self, status: Status, **extra: Any) -> dict[str, Any]:
        """A new ``info`` dict: ``status``, ``infra_failure``, ``tool_calls``, ``tool_errors`` and ``extra``."""
        return {
            "status": status,
            "infra_failure": status == "infra_failure",
            "tool_calls": self.tool_calls,
            "tool_errors": self.tool_errors,
            **extra,
        }

    # ---------------------------------------------------------------- close

    async def aclose(self) -> None:
        """Release async resources the environment created itself (e.g. its own sandbox).

        The environment stays usable: the next ``astep`` re-creates what it needs. Resources
        passed in by the caller (a shared sandbox) are the caller's to close. Default: nothing.
        """

    def close(self) -> None:
        """Run :meth:`aclose` when no event loop is running here; inside one, warn (``await
        env.unwrapped.aclose()`` instead) if the environment still holds async resources."""
        if _in_event_loop() is None:
            anyio.run(self.aclose)
        elif self.holds_async_resources():
            warnings.warn(
                f"{type(self).__name__}.close() inside an event loop cannot release its own sandbox; "
                "await env.unwrapped.aclose() instead",
                ResourceWarning,
                stacklevel=2,
            )

    def holds_async_resources(self) -> bool:
        """True while :meth:`aclose` has something to release. Default: False."""
        return False
