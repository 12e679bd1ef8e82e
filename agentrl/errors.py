"""The one exception hierarchy of agentrl.

Every error agentrl raises on purpose derives from :class:`AgentRLError`. Errors coming from
libraries (pydantic, vLLM, Ray, torch, subprocess, docker) are translated into one of these at
the boundary of the component that called the library, keeping the original as ``__cause__``.

::

    AgentRLError                    anything agentrl raises on purpose
    ├── ConfigError                 a recipe (TOML file or --set override) is malformed or invalid
    ├── ModelError                  a model/tokenizer path or hub id cannot be loaded or built
    ├── DataError                   a dataset file or row is malformed (names the file and row)
    ├── EnvError                    an environment is misregistered or misbehaves (bad return value)
    │   └── ToolCallError           a tool call written by the model is malformed (a *model* error:
    │                               environments turn it into feedback or a penalty, never a crash)
    ├── AgentError                  an agent program raised, never returned or returned no reward:
    │                               its episode is an ``agent_failure``, kept out of the loss
    ├── RequestError                a malformed request to the agent gateway (answered with a 400)
    ├── DegenerateRun               too many steps in a row could not teach the model anything
    ├── InfraError                  the infrastructure failed, not the model: episodes that hit it
    │   │                           are marked ``infra_failure`` and kept out of the loss
    │   ├── SandboxError            a sandbox backend cannot start or a worker died
    │   │   └── SandboxUnavailable  the backend is not installed on this machine (says how to fix)
    │   ├── VerifierError           a reward verifier crashed or timed out
    │   ├── GeneratorError          a generator (vLLM engine) failed or timed out
    │   ├── RewardModelError        an LLM judge, a reward model or a reward function failed, timed
    │   │                           out or gave no usable score (the episode is kept out of the
    │   │                           loss, never 0)
    │   └── LearnerError            a learner rank failed or timed out
    │       └── LearnerDied         a learner rank's process is gone (killed, out of memory, crashed)
    └── TimeoutError_               a wait ran past its deadline (also an InfraError)

Model-written code that raises, loops forever or exhausts memory is *not* an error here: it is an
ordinary sandbox result (``ExecResult`` with ``exit_code != 0``, ``timed_out`` or
``memory_exceeded``) that the environment shows to the model.
"""

from __future__ import annotations

import re

_NAMES_AN_EXCEPTION = re.compile(r"[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt)\b(\(\w+\))?:")


class AgentRLError(Exception):
    """Base class of every error agentrl raises on purpose."""


class ConfigError(AgentRLError):
    """A recipe is malformed or invalid.

    The message names the file, the key path (``learner.lr``), the value given and what was
    expected.
    """


class ModelError(AgentRLError):
    """A model or tokenizer cannot be found, loaded or built."""


class DataError(AgentRLError):
    """A dataset file or row is malformed; the message names the file and the row."""


class EnvError(AgentRLError):
    """An environment is not registered, cannot be built, or returned values of the wrong shape."""


class ToolCallError(EnvError):
    """A tool call written by the model is malformed (unknown tool, bad arguments, bad JSON).

    This is the model's mistake: environments turn it into feedback, a penalty or the end of the
    episode according to their policy; it never stops a run.
    """


class AgentError(AgentRLError):
    """An agent program (``[env] agent``) raised, never returned, or returned no usable reward."""


class RequestError(AgentRLError):
    """A request to the agent gateway is malformed or asks for what it does not serve; ``param``
    names the offending request field (as in the OpenAI error body)."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


class DegenerateRun(AgentRLError):
    """A run stopped after ``learner.max_degenerate_steps`` degenerate steps in a row (every
    prompt too long, nothing trained, no learning signal); the message says why."""


class InfraError(AgentRLError):
    """The infrastructure failed (not the model). Affected episodes are kept out of the loss."""


class SandboxError(InfraError):
    """A sandbox backend cannot start, or one of its workers died unexpectedly."""


class SandboxUnavailable(SandboxError):
    """The sandbox backend is not installed on this machine; the message says how to install it."""


class VerifierError(InfraError):
    """A reward verifier crashed or ran past its timeout."""


class GeneratorError(InfraError):
    """A generator (vLLM engine) failed, died or did not answer in time."""


class RewardModelError(InfraError):
    """An LLM judge, a reward model or the user's reward function failed, did not answer in
    time, or answered without a usable score (a judge's out of range, a function's not a finite
    number). The episode it was scoring is an ``infra_failure`` (kept out of the loss),
    never a reward of 0."""


class LearnerError(InfraError):
    """A learner rank failed or did not answer in time."""


class LearnerDied(LearnerError):
    """A learner rank's process is gone (killed, out of memory, crashed).

    ``rank`` is the rank that died (None when unknown), ``how`` says how when Ray knows (a
    signal, an exit code), ``group`` whose rank it was: ``"learner"`` or PPO's ``"critic"``."""

    def __init__(self, message: str, *, rank: int | None = None, how: str = "", group: str = "learner") -> None:
        super().__init__(message)
        self.rank = rank
        self.how = how
        self.group = group


class WeightSyncError(InfraError):
    """Sending a weight version to the generators over a collective failed or ran past its
    timeout; the run falls back to loading versions from disk."""


class TimeoutError_(InfraError, TimeoutError):
    """A wait ran past its deadline. Also a builtin :class:`TimeoutError`."""


def one_line(text: str, limit: int = 200) -> str:
    """An error's text in one line of at most ``limit`` characters, for a console line or an
    event: for a traceback (Python's, or the remote one a Ray error carries) its last line that
    names an exception (``ValueError: boom``); otherwise the first non-empty line (Ray's
    "The actor died unexpectedly before finishing this task." rather than the actor ids below it)."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if not lines:
        return ""
    if len(lines) > 1 and any(line.startswith("Traceback (most recent call last)") or line.startswith("File \"") for line in lines):
        named = [line for line in lines if _NAMES_AN_EXCEPTION.match(line)]
        if named:
            return named[-1][:limit]
    return lines[0][:limit]


def exception_in_words(exc: BaseException, limit: int = 300) -> str:
    """``exc`` in one line (:func:`one_line` of its text: a Ray task error's remote traceback gives
    its last ``SomeError: message`` line), prefixed with its type unless the line names one."""
    line = one_line(str(exc), limit)
    if _NAMES_AN_EXCEPTION.match(line):
        return line
    return f"{type(exc).__name__}: {line}" if line else type(exc).__name__
