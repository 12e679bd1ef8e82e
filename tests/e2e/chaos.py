"""Chaos for `agentrl train`: SIGKILL its components from outside, on a seeded schedule, while
it runs, then judge the run by its append-only audit logs only (Jepsen's habit). Shared by the
default suite's short chaos run (``tests/e2e/test_chaos_e2e.py``) and the harness
(``benchmarks/chaos.py``).

A fault is one SIGKILL of one process of a kind (:data:`KINDS`), once the learner has logged
step ``at_step``; faults with the same step are sent together (two at once). Each kind's
process is found the way an operator would find it: an engine actor by the log file its output
goes to (``AGENTRL_ACTOR_LOG``, :func:`tests.e2e.helpers.actor_pids`), a sandbox worker as a
``bwrap`` process the rollout worker started.

Whether a run kept its invariants is :func:`tests.e2e.helpers.audit_violations` (from
``RUN_DIR/audit/``), plus that the run exited 0 having reached ``max_steps``.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from tests.e2e.helpers import REPO, actor_pids, audit_violations, kill_tree, steps, trained_timeline

KINDS: dict[str, str] = {
    "generator": "generator 0's process (its Ray actor, which runs the vLLM engine)",
    "generator-load": "generator 0's process as soon as a new weight version is on disk for it to load",
    "learner": "learner rank 0's process",
    "rollout-worker": "rollout worker 0's process (environments, sandboxes, agent gateway)",
    "sandbox-worker": "one warm bubblewrap sandbox worker of rollout worker 0",
    "critic": "critic rank 0's process (PPO only)",
}
"""Every kind of fault: what is killed."""

RESTART_METRIC: dict[str, str | None] = {
    "generator": "generator_restarts",
    "generator-load": "generator_restarts",
    "learner": "learner_restarts",
    "rollout-worker": "rollout_worker_restarts",
    "sandbox-worker": "sandbox_worker_restarts",  # when the pool finds it dead (the next execution on it), said after that step
    "critic": "critic_restarts",
}
"""The ``metrics.jsonl`` event counter a replacement of each kind adds to (None: not an event)."""

ACTOR_LOG = {"generator": "generator-0", "generator-load": "generator-0", "learner": "learner-0",
             "rollout-worker": "rollout-0", "critic": "critic-0"}
"""The actor log (``RUN_DIR/logs/<name>.log``) of each kind's process."""


@dataclass
class Fault:
    """One SIGKILL: ``kind`` (a key of :data:`KINDS`) once step ``at_step`` is logged."""

    kind: str
    at_step: int
    pid: int | None = None
    """The process killed (None: not injected)."""
    sent_at_step: int | None = None
    """The newest step logged when it was sent."""
    note: str = ""
    """What was killed (``generator-load``: at which weight version), or why it was not."""


def schedule(seed: int, *, faults: int, max_steps: int, kinds: tuple[str, ...]) -> list[Fault]:
    """A seeded fault schedule: ``faults`` faults of kinds drawn from ``kinds`` (every kind once
    before any twice), at steps drawn from ``1 .. max_steps - 2`` (the last steps are left for the
    run to finish after its repairs); with two or more faults, one pair is sent at once (two
    different kinds at the same step). In step order."""
    rng = random.Random(seed)
    pool: list[str] = []
    while len(pool) < faults:
        pool += rng.sample(kinds, len(kinds))
    chosen = pool[:faults]
    last = max(1, max_steps - 2)
    at = [rng.randint(1, last) for _ in chosen]
    if faults >= 2:
        i, j = rng.sample(range(faults), 2)
        if _process(chosen[i]) == _process(chosen[j]):  # two at once are two different processes
            other = [k for k in kinds if _process(k) != _process(chosen[i])]
            chosen[j] = rng.choice(other) if other else chosen[j]
        at[j] = at[i]
    return sorted((Fault(k, s) for k, s in zip(chosen, at)), key=lambda f: f.at_step)


def _process(kind: str) -> str:
    """The process a kind kills (``generator`` and ``generator-load`` kill the same one)."""
    return ACTOR_LOG.get(kind, kind)


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def actor_process(run_dir: Path, name: str, killed: set[int]) -> int | None:
    """The live process of engine actor ``name`` (``generator-0``, ``learner-0``, ...): among
    the processes writing to its log, the one whose parent is not among them (vLLM's engine
    processes are its children); None while there is none (not started yet, or being replaced)."""
    pids = [p for p in actor_pids(run_dir, name) if p not in killed and _alive(p)]
    for pid in pids:
        try:
            if psutil.Process(pid).ppid() not in pids:
                return pid
        except psutil.NoSuchProcess:
            continue
    return None


def sandbox_workers(rollout_pid: int) -> list[int]:
    """The warm sandbox workers of the rollout worker ``rollout_pid``: its ``bwrap`` descendants
    whose parent is not a ``bwrap`` process (bubblewrap forks itself inside a container)."""
    out = []
    try:
        family = psutil.Process(rollout_pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []
    for p in family:
        try:
            if p.name() == "bwrap" and p.parent() is not None and p.parent().name() != "bwrap" and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p.pid)
        except psutil.NoSuchProcess:
            continue
    return sorted(out)


def _newest_weights(run_dir: Path) -> int:
    folder = run_dir / "weights"
    versions = [int(p.name[1:]) for p in folder.glob("v*") if p.name[1:].isdigit()] if folder.is_dir() else []
    return max(versions, default=0)


@dataclass
class ChaosResult:
    """How one chaos run went."""

    seed: int
    faults: list[Fault]
    rc: int | None
    """The run's exit status (None: it was stopped for running past its time)."""
    wall_s: float
    violations: list[str]
    """Invariants broken (empty: every one held)."""
    restarts: dict[str, int] = field(default_factory=dict)
    """The run's replacement events, summed per counter (``generator_restarts``, ...)."""
    load_failures: int = 0
    """Events saying a generator failed to load a version (a kill that landed during a load)."""
    console_tail: str = ""
    steps: int = 0
    """The last learner step behind the final weights (from the learner's audit log)."""

    @property
    def finished(self) -> bool:
        """The run exited 0 and kept every invariant."""
        return self.rc == 0 and not self.violations


def run_with_faults(cmd: list[str], run_dir: Path, log_path: Path, faults: list[Fault], *, seed: int, max_steps: int,
                    group: int, staleness: int, batch: int, warmup_steps: int = 0, timeout_s: float = 900,
                    find_timeout_s: float = 120) -> ChaosResult:
    """Run ``cmd`` (an ``agentrl train`` command writing into ``run_dir``, console into
    ``log_path``), sending each fault once its step is logged (faults of one step together),
    then check the run: exit 0 and :func:`~tests.e2e.helpers.audit_violations`. A fault whose
    process cannot be found within ``find_timeout_s`` of its step (or before the run ends) is
    not injected and says why in its ``note``; the run is SIGKILLed whole past ``timeout_s``."""
    rng = random.Random(seed)
    pending = sorted(faults, key=lambda f: f.at_step)
    killed: set[int] = set()
    due_since: dict[int, float] = {}
    t0 = time.monotonic()
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, text=True,
                                env={**os.environ, "RAY_DEDUP_LOGS": "0"}, start_new_session=True)
    rc: int | None = None
    try:
        while proc.poll() is None and time.monotonic() - t0 < timeout_s:
            step = max(steps(run_dir), default=0)
            due = [f for f in pending if step >= f.at_step]
            targets: list[tuple[Fault, int]] = []
            for f in due:
                due_since.setdefault(id(f), time.monotonic())
                pid = _find(f, run_dir, killed, rng)
                if pid is not None:
                    targets.append((f, pid))
                elif time.monotonic() - due_since[id(f)] > find_timeout_s:
                    f.pid = None
                    f.note = f"not sent: no {f.kind} target within {find_timeout_s:.0f} s of step {f.at_step}" + (f" ({f.note})" if f.note else "")
                    pending.remove(f)
            for f, pid in targets:  # together: faults of one step are found first, then killed back to back
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    f.pid = None
                    continue  # gone meanwhile: found again on the next round
                f.pid, f.sent_at_step = pid, step
                killed.add(pid)
                pending.remove(f)
            time.sleep(0.01 if any(f.kind == "generator-load" for f in due) else 0.25)
        if proc.poll() is None:
            kill_tree(proc)
        else:
            rc = proc.returncode
    finally:
        if proc.poll() is None:
            kill_tree(proc)
    for f in pending:  # never sent (a generator-load fault may hold the pid it was waiting to kill)
        f.pid = None
        f.note = f"not sent: the run ended before step {f.at_step} was logged" + (f" ({f.note})" if f.note else "")
    console = log_path.read_text()
    return judge(run_dir, seed=seed, faults=faults, rc=rc, wall_s=time.monotonic() - t0, console=console,
                 max_steps=max_steps, group=group, staleness=staleness, batch=batch, warmup_steps=warmup_steps)


def _find(f: Fault, run_dir: Path, killed: set[int], rng: random.Random) -> int | None:
    """The process fault ``f`` kills now, or None (not there yet; ``generator-load``: no new
    weight version yet)."""
    if f.kind == "sandbox-worker":
        rollout = actor_process(run_dir, ACTOR_LOG["rollout-worker"], killed)
        workers = [p for p in sandbox_workers(rollout) if p not in killed] if rollout is not None else []
        if not workers:
            return None
        pid = rng.choice(workers)
        f.note = f"one of {len(workers)} warm workers"
        return pid
    if f.kind == "generator-load":
        # the generator's process is found when the fault falls due (finding it takes a scan of
        # every process), then killed the moment a newer version than the one on disk then appears
        newest = _newest_weights(run_dir)
        if f.pid is None or not _alive(f.pid):
            f.pid = actor_process(run_dir, ACTOR_LOG[f.kind], killed)
            if not f.note.startswith("after v"):
                f.note = f"after v{newest}"
            return None
        if newest <= int(f.note.split("v", 1)[1]):
            return None
        f.note = f"as v{newest} was published"
        return f.pid
    return actor_process(run_dir, ACTOR_LOG[f.kind], killed)


def judge(run_dir: Path, *, seed: int, faults: list[Fault], rc: int | None, wall_s: float, console: str, max_steps: int,
          group: int, staleness: int, batch: int, warmup_steps: int = 0) -> ChaosResult:
    """The verdict on a finished chaos run: its invariants from the audit logs, its replacement
    events, and the console's last lines."""
    violations: list[str] = []
    if rc != 0:
        violations.append(f"the run exited {rc}" if rc is not None else "the run did not end in time (stopped)")
    if "Traceback" in console:
        violations.append("a traceback on the console")
    traceback_file = run_dir / "logs" / "traceback.txt"
    if rc not in (0, None) and traceback_file.is_file():  # the run's own record of an unexpected error
        violations.append("its traceback (logs/traceback.txt):\n" + "\n".join(traceback_file.read_text().splitlines()[-40:]))
    summary_path = run_dir / "summary.json"
    if summary_path.is_file():
        summary = json.loads(summary_path.read_text())
        violations += audit_violations(run_dir, summary, max_steps=max_steps, group=group, staleness=staleness, batch=batch,
                                       warmup_steps=warmup_steps)
    elif rc == 0:
        violations.append("no summary.json")
    restarts: dict[str, int] = {}
    load_failures = 0
    metrics = run_dir / "metrics.jsonl"
    for line in metrics.read_text().splitlines() if metrics.is_file() else []:
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue
        if rec.get("kind") != "event":
            continue
        for key in {m for m in RESTART_METRIC.values() if m}:
            restarts[key] = restarts.get(key, 0) + int(rec.get(key, 0) or 0)
        load_failures += "failed to load version" in str(rec.get("message", ""))
    timeline, _ = trained_timeline(run_dir)
    return ChaosResult(seed=seed, faults=faults, rc=rc, wall_s=wall_s, violations=violations, restarts=restarts,
                       load_failures=load_failures, console_tail="\n".join(console.splitlines()[-15:]),
                       steps=timeline[-1]["step"] if timeline else 0)


def describe(faults: list[Fault]) -> str:
    """``learner@2 + rollout-worker@2, generator@4`` (``!`` marks a fault not sent)."""
    by_step: dict[int, list[str]] = {}
    for f in faults:
        by_step.setdefault(f.at_step, []).append(f.kind + ("" if f.pid is not None else "!"))
    return ", ".join(" + ".join(f"{k}@{s}" for k in kinds) for s, kinds in sorted(by_step.items()))
