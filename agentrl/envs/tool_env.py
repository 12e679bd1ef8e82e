"""``ToolEnv``: a :class:`~agentrl.envs.base.TextEnv` whose model calls tools, then answers.

A new tool environment is a subclass with tools, a prompt and a reward::

    def add(a: int, b: int) -> int:
        \"\"\"Add two integers.

        Args:
            a: the first addend.
            b: the second addend.
        \"\"\"
        return a + b

    class AdderEnv(ToolEnv):
        tools = [add]
        system_prompt = "Use the tools, then give the final answer in \\\\boxed{}."

        def reward(self, action: str, row: dict) -> float:
            return float(extract_boxed(action) == str(row["answer"]))

An episode: ``reset`` returns ``[system (system_prompt + how to call the tools), user (question)]``;
each action either holds tool calls (they run, in order, and their outputs come back as the next
messages) or none (it is the final answer: :meth:`ToolEnv.reward` scores it and the episode ends).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from agentrl.envs.base import Message, StepResult, TextEnv
from agentrl.envs.parsers import ToolCall, ToolCallParser, ToolOutput, get_parser
from agentrl.envs.tools import PythonSession, PythonTool, Tool, ToolLimits, as_tool, truncate_middle
from agentrl.errors import ConfigError, InfraError, SandboxError, ToolCallError

if TYPE_CHECKING:
    from agentrl.sandbox.base import Sandbox

__all__ = ["ToolEnv", "MalformedPolicy"]

MalformedPolicy = Literal["feedback", "end", "penalty"]
"""What a malformed tool call does; see :class:`ToolEnv`."""


class ToolEnv(TextEnv):
    """A tool-calling environment: the model calls tools for a few turns, then answers.

    **Subclasses** set the class attributes below (or pass the same names to ``__init__``) and
    implement :meth:`reward` (or :meth:`score` for extra ``info``); they may override
    :meth:`user_message`, :meth:`sample_row` and :meth:`initial_messages`.

    **reset** returns ``[system, user]``: ``system_prompt`` followed by the tool-call format's
    description of the tools (nothing is added when there are no tools), and
    :meth:`user_message` of the row (default: ``row["question"]``). A row of chat ``messages``
    (a conversational dataset) starts from its conversation; see :meth:`initial_messages`.

    **step(action)** — the action is parsed with the tool-call format (see
    :mod:`agentrl.envs.parsers`):

    - **no tool call**: the final answer. ``terminated=True``, ``[]``, reward :meth:`score`;
      ``info["end_reason"] = "answer"`` plus what ``score`` adds.
    - **tool calls**: each counts in ``info["tool_calls"]``. Well-formed calls of known tools
      run in order; each tool's output (cut to ``max_output_chars``, head and tail kept; the
      environment's own error messages are never cut) comes back in
      the messages the format makes (e.g. one ``tool`` message per call). Reward 0.0, status
      ``"ok"``. A call that fails (the tool raised or timed out, the code raised...) is shown to
      the model and counted in ``info["tool_errors"]``.
    - **malformed calls** (unreadable, unknown tool, arguments that do not fit the tool) are
      counted in ``tool_calls`` and ``tool_errors`` and handled by ``malformed``:

      - ``"feedback"`` (default): the call's output is ``"ToolCallError: <what is wrong>"``, the
        other calls run, the episode goes on; status ``"malformed"``;
      - ``"penalty"``: the same, and this step's reward is ``-malformed_penalty`` per malformed
        call (the engine sums step rewards into the episode reward);
      - ``"end"``: nothing runs; the episode ends at once with ``terminated=True``, ``[]``,
        reward 0.0, status ``"ok"``, ``info["end_reason"] = "malformed"`` and
        ``info["malformed"]`` (the error messages). It is a normal, scored end: the model's
        mistake is trained on.

    - **limits**: the ``max_turns``-th action that is not a final answer truncates the episode
      (``truncated=True``, status ``"truncated"``, ``end_reason = "max_turns"``; the tool
      messages are still returned). Calls beyond ``max_tool_calls`` per episode are not run
      (their output says so, and they count as tool errors) and the episode is truncated
      (``end_reason = "max_tool_calls"``).
    - **infrastructure failure** (an :class:`~agentrl.errors.InfraError` from a tool, the
      sandbox or the verifier, or a sandbox silent past its deadline): ``[]``, reward 0.0
      (meaningless), ``truncated=True``, status ``"infra_failure"``, ``info["error"]``.

    The ``info`` of a step that does not end the episode holds only the four base keys; the
    last step adds ``end_reason``.

    Args:
        tools: the tools (:class:`~agentrl.envs.tools.Tool` objects, or plain typed functions,
            wrapped with :class:`~agentrl.envs.tools.FunctionTool`); default: the class's ``tools``.
        tool_format: ``"hermes"``, ``"qwen"``, ``"retool"``, a
            :class:`~agentrl.envs.parsers.ToolCallParser`, or None (no tools: every action is a
            final answer); default: the class's ``tool_format``.
        system_prompt: the task instructions; default: the class's ``system_prompt``.
        sandbox: where code runs (for sandbox tools such as
            :class:`~agentrl.envs.tools.PythonTool`). A Sandbox object is used as is and never
            closed here; a kind (``"bubblewrap"``, ``"unsafe-local"``) or None (= ``"bubblewrap"``)
            makes the env create its own at the first code call and close it in :meth:`aclose`.
        max_turns: actions per episode (>= 1).
        max_tool_calls: tool calls per episode (None: no limit beyond ``max_turns``).
        max_output_chars: longest tool output shown to the model, characters.
        malformed: the malformed-call policy: ``"feedback"``, ``"end"`` or ``"penalty"``.
        malformed_penalty: reward subtracted per malformed call under ``"penalty"`` (>= 0).
        timeout_s: wall-clock limit of one code execution, seconds (None: the sandbox's default).
        memory_mb: memory limit of one code execution, MiB (None: the sandbox's default).
        tool_timeout_s: limit of one function-tool call, seconds (None: none).

    Raises:
        ConfigError: an argument is out of range, a tool has no JSON schema, two tools share a
            name, or the tool format cannot express the tools.
    """

    tools: ClassVar[Sequence[Tool | Callable[..., Any]]] = ()
    """The tools of every instance (unless ``tools=`` is passed)."""
    tool_format: ClassVar[str | ToolCallParser | None] = "hermes"
    """The tool-call format (unless ``tool_format=`` is passed)."""
    system_prompt: ClassVar[str] = "Use the tools when they help. Give the final answer in \\boxed{}."
    """The task instructions (unless ``system_prompt=`` is passed)."""
    required_fields: ClassVar[tuple[str, ...]] = ("question",)
    deadline_grace_s: float = 30.0
    """A code call with no result after ``2 * timeout_s + deadline_grace_s`` seconds (``timeout_s``
    None counts as 30) is an infrastructure failure."""

    def __init__(
        self,
        *,
        tools: Sequence[Tool | Callable[..., Any]] | None = None,
        tool_format: str | ToolCallParser | None = "",
        system_prompt: str | None = None,
        sandbox: Sandbox | str | None = None,
        max_turns: int = 8,
        max_tool_calls: int | None = 16,
        max_output_chars: int = 4000,
        malformed: MalformedPolicy = "feedback",
        malformed_penalty: float = 0.1,
        timeout_s: float | None = None,
        memory_mb: int | None = None,
        tool_timeout_s: float | None = 60.0,
    ) -> None:
        super().__init__()
        if max_turns < 1:
            raise ConfigError(f"max_turns must be >= 1, got {max_turns}")
        if max_tool_calls is not None and max_tool_calls < 0:
            raise ConfigError(f"max_tool_calls must be >= 0 or None, got {max_tool_calls}")
        if max_output_chars < 1:
            raise ConfigError(f"max_output_chars must be >= 1, got {max_output_chars}")
        if malformed not in ("feedback", "end", "penalty"):
            raise ConfigError(f"malformed must be 'feedback', 'end' or 'penalty', got {malformed!r}")
        if malformed_penalty < 0:
            raise ConfigError(f"malformed_penalty must be >= 0, got {malformed_penalty}")
        fmt = type(self).tool_format if tool_format == "" else tool_format
        self.parser: ToolCallParser | None = None if fmt is None else get_parser(fmt)
        self.toolbox: dict[str, Tool] = {}
        """The tools by name."""
        for item in type(self).tools if tools is None else tools:
            t = as_tool(item)
            if t.name in self.toolbox:
                raise ConfigError(f"{type(self).__name__}: two tools are named {t.name!r}")
            self.toolbox[t.name] = t
        if self.toolbox and self.parser is None:
            raise ConfigError(f"{type(self).__name__}: tools {sorted(self.toolbox)} need a tool_format")
        self.instructions = type(self).system_prompt if system_prompt is None else system_prompt
        """The system prompt's task instructions."""
        self.tool_prompt = self.parser.describe_tools([t.schema() for t in self.toolbox.values()]) if self.toolbox and self.parser else ""
        """How to call the tools (from the tool-call format), appended to the instructions."""
        self.sandbox_kind = sandbox if isinstance(sandbox, str) or sandbox is None else None
        self.sandbox = None if self.sandbox_kind else sandbox
        self.own_sandbox: Sandbox | None = None
        self.max_turns = max_turns
        self.max_tool_calls = max_tool_calls
        self.max_output_chars = max_output_chars
        self.malformed = malformed
        self.malformed_penalty = malformed_penalty
        self.timeout_s = timeout_s
        self.memory_mb = memory_mb
        self.tool_timeout_s = tool_timeout_s
        self.sessions: dict[str, PythonSession] = {}
        """This episode's interpreter sessions, by tool name."""
        self._stale_sessions: list[PythonSession] = []

    # ---------------------------------------------------------------- episode

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[list[Message], dict[str, Any]]:
        """Start an episode (see :meth:`TextEnv.reset`); the previous episode's interpreter
        sessions are closed at the next ``astep`` or ``aclose``."""
        self._stale_sessions.extend(self.sessions.values())
        self.sessions = {}
        return super().reset(seed=seed, options=options)

    def initial_messages(self, row: dict[str, Any]) -> list[Message]:
        """``[system, user]``; see the class docstring. A row with a ``messages`` prompt
        conversation (:mod:`agentrl.envs.data`) starts from that conversation instead: its
        leading system messages join the environment's system prompt (after it), the other
        messages follow in order, and its last user message is :meth:`user_message` of the row."""
        system = "\n\n".join(p for p in (self.instructions, self.tool_prompt) if p)
        conversation: list[Message] = [{"role": str(m["role"]), "content": str(m["content"])} for m in row.get("messages") or []]
        head = 0
        while head < len(conversation) and conversation[head]["role"] == "system":
            head += 1
        system = "\n\n".join(p for p in (system, *(m["content"] for m in conversation[:head])) if p)
        messages: list[Message] = [{"role": "system", "content": system}] if system else []
        rest = conversation[head:]
        last_user = max((i for i, m in enumerate(rest) if m["role"] == "user"), default=None)
        if last_user is None:
            return [*messages, *rest, {"role": "user", "content": self.user_message(row)}]
        rest[last_user] = {"role": "user", "content": self.user_message(row)}
        return [*messages, *rest]

    def user_message(self, row: dict[str, Any]) -> str:
        """The first user message of an episode about ``row``. Default: ``str(row["question"])``."""
        return str(row["question"])

    def reward(self, action: str, row: dict[str, Any]) -> float | Any:
        """The reward of the final answer ``action`` for ``row``: a float, or an awaitable of one.

        May raise :class:`~agentrl.errors.InfraError` (e.g. a VerifierError): the episode is then
        an infrastructure failure. Subclasses implement this (or :meth:`score`).
        """
        raise NotImplementedError(f"{type(self).__name__} must implement reward(action, row) or score(action)")

    async def score(self, action: str) -> tuple[float, dict[str, Any]]:
        """``(reward, extra info)`` for the final answer ``action``. Default: :meth:`reward`
        (awaited if it returns an awaitable) and no extra info."""
        assert self.row is not None
        value = self.reward(action, self.row)
        if inspect.isawaitable(value):
            value = await value
        return float(value), {}

    def truncate_output(self, text: str) -> str:
        """A tool output as the model sees it: at most ``max_output_chars`` characters (head and
        tail kept, see :func:`~agentrl.envs.tools.truncate_middle`)."""
        return truncate_middle(text, self.max_output_chars)

    # ---------------------------------------------------------------- step

    async def astep(self, action: str) -> StepResult:
        """One turn; see the class docstring for what is returned."""
        self.start_turn()
        try:
            await self._close_stale()
            calls = self.parser.parse(action) if self.parser is not None else []
            if not calls:
                self.done = True
                reward, extra = await self.score(action)
                return [], reward, True, False, self.make_info("ok", end_reason="answer", **extra)
            return await self._run_calls(calls)
        except InfraError as exc:
            self.done = True
            return [], 0.0, False, True, self.make_info("infra_failure", end_reason="infra", error=f"{type(exc).__name__}: {exc}")

    def check_call(self, call: ToolCall) -> str | None:
        """Why ``call`` cannot run (unreadable, unknown tool, arguments that do not fit), or None."""
        if call.error is not None:
            return call.error
        tool = self.toolbox.get(call.name)
        if tool is None:
            known = ", ".join(sorted(self.toolbox)) or "none"
            return f"unknown tool {call.name!r} (tools: {known})"
        bind = getattr(tool, "bind", None)
        if bind is not None:
            try:
                bind(call.arguments)
            except ToolCallError as exc:
                return str(exc)
        return None

    async def _run_calls(self, calls: list[ToolCall]) -> StepResult:
        problems = [self.check_call(c) for c in calls]
        bad = [p for p in problems if p is not None]
        if bad and self.malformed == "end":
            self.tool_calls += len(calls)
            self.tool_errors += len(bad)
            self.done = True
            return [], 0.0, True, False, self.make_info("ok", end_reason="malformed", malformed=bad)
        budget = None if self.max_tool_calls is None else self.max_tool_calls - self.tool_calls
        outputs: list[ToolOutput] = []
        for i, (call, problem) in enumerate(zip(calls, problems)):
            self.tool_calls += 1
            if budget is not None and i >= budget:
                out = ToolOutput(f"Error: the limit of {self.max_tool_calls} tool calls per episode is reached; this call was not run", True, call.name)
            elif problem is not None:
                out = ToolOutput(f"ToolCallError: {problem}", True, call.name)
            else:
                try:
                    out = await self.toolbox[call.name].call(call.arguments, self)
                    out = ToolOutput(self.truncate_output(out.text), out.error, out.name)
                except ToolCallError as exc:  # a tool without bind() found the arguments wrong
                    out = ToolOutput(f"ToolCallError: {exc}", True, call.name)
                    bad.append(str(exc))
            self.tool_errors += int(out.error)
            outputs.append(out)
        messages = self.parser.format_outputs(outputs) if self.parser is not None else []
        reward = -self.malformed_penalty * len(bad) if self.malformed == "penalty" else 0.0
        end_reason = None
        if budget is not None and len(calls) > budget:
            end_reason = "max_tool_calls"
        elif self.turn >= self.max_turns:
            end_reason = "max_turns"
        if end_reason is not None:
            self.done = True
            return messages, reward, False, True, self.make_info("truncated", end_reason=end_reason)
        return messages, reward, False, False, self.make_info("malformed" if bad else "ok")

    # ---------------------------------------------------------------- tool context

    @property
    def limits(self) -> ToolLimits:
        """The limits of this env's tool calls, from its current ``timeout_s``, ``memory_mb``,
        ``tool_timeout_s`` and ``deadline_grace_s``."""
        return ToolLimits(
            timeout_s=self.timeout_s,
            memory_mb=self.memory_mb,
            tool_timeout_s=self.tool_timeout_s,
            deadline_grace_s=self.deadline_grace_s,
        )

    async def get_sandbox(self) -> Sandbox:
        """The sandbox code runs in: the one passed in, or the env's own (created now if needed).

        Raises:
            SandboxError: the sandbox package cannot be imported or the sandbox cannot be created.
        """
        if self.sandbox is not None:
            return self.sandbox
        if self.own_sandbox is None:
            try:
                from agentrl.sandbox import create_sandbox
            except ImportError as exc:
                raise SandboxError(f"agentrl.sandbox cannot be imported: {exc}") from exc
            self.own_sandbox = create_sandbox(self.sandbox_kind or "bubblewrap")
        return self.own_sandbox

    def python_session(self, tool: PythonTool) -> PythonSession:
        """This episode's interpreter session for ``tool`` (created at its first use)."""
        session = self.sessions.get(tool.name)
        if session is None:
            session = self.sessions[tool.name] = PythonSession(tool)
        return session

    # ---------------------------------------------------------------- close

    async def _close_stale(self) -> None:
        stale, self._stale_sessions = self._stale_sessions, []
        for session in stale:
            await session.aclose()

    def holds_async_resources(self) -> bool:
        return self.own_sandbox is not None or any(s.is_live for s in (*self.sessions.values(), *self._stale_sessions))

    async def aclose(self) -> None:
        """Close live interpreter sessions (their cells are kept: a later call restores them) and
        the sandbox this env created itself (a sandbox passed in is left open)."""
        await self._close_stale()
        for session in self.sessions.values():
            await session.aclose()
        sandbox, self.own_sandbox = self.own_sandbox, None
        if sandbox is not None:
            await sandbox.aclose()
