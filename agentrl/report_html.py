"""``report/index.html``: one self-contained page to read a run in a browser, offline.

- **Training curves**: Plotly figures built here with ``plotly.graph_objects`` and drawn by
  Plotly's own bundle, inlined in the page (no network, no chart code of ours). The curves are
  reward and held-out accuracy (of every held-out set), throughput, the staleness of trained
  samples, loss and grad norm, tool use at each evaluation (ReTool's measurements: tool-call
  rate, code blocks per episode, code error rate, recovery rate, response length), and (for runs
  that log them) dynamic sampling: groups sampled per step, those with a learning
  signal, those set aside as solved or failed, the refill factor.
- **Evaluation table**: every evaluation record.
- **Trajectory browser**: the episodes of ``samples.jsonl`` (training) and ``eval_samples.jsonl``.
  Each episode is shown turn by turn (system, user, assistant, tool), with tool calls
  (``<tool_call>``, ``<code>``) and tool output set apart, and its reward, status and error. Every
  generated token is coloured by the weight version that sampled it: prompt and tool text are
  plain, so staleness and in-flight updates (a colour change inside one turn) show at a glance.
  The browser filters by step, reward and status, and shows 20 episodes per page. At most
  :data:`MAX_EPISODES` episodes are embedded: every failure, and an even sample of the rest.

Turns are found from ChatML markers (``<|im_start|>role``...``<|im_end|>``: Qwen, SmolLM2, the
tiny model). Other templates show as one block, still coloured by version.
"""

from __future__ import annotations

import html
import json
import re
from pathlib import Path
from typing import Any

from agentrl.engine.loop.evaluation import eval_sets

__all__ = ["MAX_EPISODES", "TOOL_USE_COLUMNS", "write_html_report", "episode_turns"]

MAX_EPISODES = 2000
"""Most episodes embedded in the page (every failure first, then an even sample)."""

_TURN = re.compile(r"<\|im_start\|>(\w+)\n")
_CALL = re.compile(r"<tool_call>.*?(?:</tool_call>|$)|<code>.*?(?:</code>|$)", re.DOTALL)


def _split_pieces(pieces: list[list[Any]], cuts: list[int]) -> list[list[Any]]:
    """``pieces`` ([text, version]) cut at the character offsets ``cuts`` of their joined text."""
    out: list[list[Any]] = []
    pos = 0
    cuts = sorted(set(cuts))
    for text, version in pieces:
        start = pos
        for c in [c for c in cuts if start < c < start + len(text)]:
            out.append([text[: c - start], version])
            text, start = text[c - start:], c
        out.append([text, version])
        pos = start + len(text)
    return [p for p in out if p[0]]


def episode_turns(spans: list[list[Any]]) -> list[dict[str, Any]]:
    """An episode's ``spans`` ([text, version], see :mod:`agentrl.engine.common.episode_text`) as turns
    ``{"role", "pieces": [[text, version, in_call], ...]}``; ``in_call`` is 1 inside a tool call
    the assistant wrote (``<tool_call>`` or ``<code>``)."""
    full = "".join(t for t, _ in spans)
    marks = list(_TURN.finditer(full))
    if not marks:
        bounds = [(0, len(full), "text")]
    else:
        bounds = [(m.start(), marks[i + 1].start() if i + 1 < len(marks) else len(full), m.group(1)) for i, m in enumerate(marks)]
        if marks[0].start() > 0:
            bounds.insert(0, (0, marks[0].start(), "text"))
    cuts = [b for a, b, _ in bounds] + [a for a, _, _ in bounds]
    calls = [(m.start(), m.end()) for m in _CALL.finditer(full)]
    cuts += [x for c in calls for x in c]
    pieces = _split_pieces(spans, cuts)
    turns: list[dict[str, Any]] = []
    pos = 0
    index = 0
    for text, version in pieces:
        while index + 1 < len(bounds) and pos >= bounds[index][1]:
            index += 1
        if not turns or turns[-1]["_i"] != index:
            turns.append({"_i": index, "role": bounds[index][2], "pieces": []})
        in_call = int(bounds[index][2] == "assistant" and any(a <= pos < b for a, b in calls))
        turns[-1]["pieces"].append([text, version, in_call])
        pos += len(text)
    for t in turns:
        del t["_i"]
    return turns


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue  # a line cut by a crash: skip it, keep the rest
    return out


def _episodes(run_dir: Path) -> tuple[list[dict[str, Any]], int]:
    """The embedded episodes (training then evaluation) and how many there were in all."""
    rows = [{**r, "source": "train"} for r in _read_jsonl(run_dir / "samples.jsonl")]
    rows += [{**r, "source": "eval"} for r in _read_jsonl(run_dir / "eval_samples.jsonl")]
    total = len(rows)
    if total > MAX_EPISODES:
        failed = [r for r in rows if r.get("status") not in ("ok", "truncated", "overflow")]
        rest = [r for r in rows if r.get("status") in ("ok", "truncated", "overflow")]
        room = max(0, MAX_EPISODES - len(failed))
        stride = max(1, len(rest) / max(1, room))
        rows = failed[:MAX_EPISODES] + [rest[int(i * stride)] for i in range(min(room, len(rest)))]
    episodes = []
    for i, r in enumerate(rows):
        spans = r.get("spans") or ([[r.get("text", ""), -1]] if r.get("text") else [])
        episodes.append({
            "i": i, "step": int(r.get("version", 0)), "source": r["source"], "group": r.get("group_id", ""),
            "reward": float(r.get("reward", 0.0)), "status": r.get("status", ""), "error": r.get("error", ""),
            "turns": episode_turns(spans),
        })
    return episodes, total


def _figures(steps: list[dict[str, Any]], evals: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The curves as Plotly figure dicts (``{"data": ..., "layout": ...}``)."""
    import plotly.graph_objects as go

    x = [s.get("step") for s in steps]

    def line(key: str, name: str, records: list[dict[str, Any]] = steps, xs: list[Any] | None = None, **kw: Any) -> Any:
        pts = [(xx, r[key]) for xx, r in zip(xs or [r.get("step") for r in records], records) if isinstance(r.get(key), (int, float))]
        return go.Scatter(x=[p[0] for p in pts], y=[p[1] for p in pts], name=name, mode="lines+markers", **kw)

    layout = {"margin": {"l": 50, "r": 40, "t": 40, "b": 80}, "height": 340,
              "legend": {"orientation": "h", "yanchor": "top", "y": -0.22, "xanchor": "left", "x": 0.0}}
    versions = [e.get("version") for e in evals]
    figs = [
        go.Figure([line("reward_mean", "training reward"), line("accuracy", "held-out accuracy", evals, versions),
                   *(line(f"{n}/accuracy", f"held-out accuracy ({n})", evals, versions) for n in eval_sets(evals)),
                   line("tool_call_rate", "held-out tool-call rate", evals, versions, line={"dash": "dot"})],
                  {**layout, "title": "reward, accuracy", "xaxis": {"title": "step (weight version)"}}),
        go.Figure([line("gen_tokens_per_s", "generated tok/s"), line("train_tokens_per_s", "trained tok/s")],
                  {**layout, "title": "throughput (tokens/s)", "xaxis": {"title": "step"}}),
    ]
    if any("tool_error_rate" in e for e in evals):  # ReTool's measurements, at every evaluation
        figs.append(go.Figure(
            [line(k, label, evals, versions) for k, label, _ in TOOL_USE_COLUMNS if k not in ("response_tokens_mean", "tool_calls_mean")]
            + [line("tool_calls_mean", "code blocks / episode", evals, versions, yaxis="y2", line={"dash": "dot"}),
               line("response_tokens_mean", "response tokens / episode", evals, versions, yaxis="y3", line={"dash": "dash"})],
            {**layout, "title": "tool use at each evaluation", "xaxis": {"title": "weight version", "domain": [0, 0.85]},
             "yaxis": {"title": "share of episodes / calls", "range": [-0.02, 1.02]},
             "yaxis2": {"overlaying": "y", "side": "right", "title": "blocks"},
             "yaxis3": {"overlaying": "y", "side": "right", "position": 0.95, "anchor": "free", "title": "tokens"}},
        ))
    lags = sorted({int(k) for s in steps for k in (s.get("staleness_hist") or {})})
    figs.append(go.Figure(
        [go.Bar(x=x, y=[(s.get("staleness_hist") or {}).get(str(k), 0) for s in steps], name=f"{k} behind") for k in lags],
        {**layout, "barmode": "stack", "title": "staleness (versions behind)", "xaxis": {"title": "step"}, "yaxis": {"title": "episodes"}},
    ))
    figs.append(go.Figure([line("loss", "loss"), line("grad_norm", "grad norm", yaxis="y2")],
                          {**layout, "title": "loss, grad norm", "xaxis": {"title": "step"},
                           "yaxis2": {"overlaying": "y", "side": "right"}}))
    if any("groups_sampled" in s for s in steps):  # dynamic sampling (algo.dynamic_sampling)
        figs.append(go.Figure(
            [go.Bar(x=x, y=[s.get(k, 0) for s in steps], name=name) for k, name in
             (("set_aside_solved", "set aside: solved"), ("set_aside_failed", "set aside: failed"))]
            + [line("groups_sampled", "groups sampled"), line("groups_with_signal", "groups with signal"),
               line("refill_factor", "refill factor (sampled / batch groups)", yaxis="y2", line={"dash": "dot"})],
            {**layout, "barmode": "stack", "title": "dynamic sampling (groups per step)", "xaxis": {"title": "step"},
             "yaxis": {"title": "groups"}, "yaxis2": {"overlaying": "y", "side": "right", "title": "refill factor"}},
        ))
    return [json.loads(f.to_json()) for f in figs]


TOOL_USE_COLUMNS: list[tuple[str, str, str]] = [
    ("tool_call_rate", "tool-call rate", "{:.3f}"), ("tool_calls_mean", "code blocks / episode", "{:.2f}"),
    ("tool_error_rate", "code error rate", "{:.3f}"), ("recovery_rate", "recovery rate", "{:.3f}"),
    ("response_tokens_mean", "response tokens", "{:.0f}"),
]
"""ReTool's measurements of an evaluation record (key, column label, format): the share of
episodes that called the tool, calls per episode, the share of calls that failed, the share of
episodes with a failed call that still solved the task, and tokens written per episode."""


def _eval_table(evals: list[dict[str, Any]]) -> str:
    cols = [("version", "version", "{:.0f}"), ("accuracy", "accuracy", "{:.3f}"),
            *((f"{n}/accuracy", f"{n} accuracy", "{:.3f}") for n in eval_sets(evals)), ("reward_mean", "mean reward", "{:.3f}"),
            *TOOL_USE_COLUMNS, ("turns_mean", "turns", "{:.2f}"), ("episodes", "episodes", "{:.0f}"),
            ("infra_failures", "infra failures", "{:.0f}"), ("agent_failures", "agent failures", "{:.0f}")]
    head = "".join(f"<th>{html.escape(label)}</th>" for _, label, _ in cols)
    rows = []
    for e in evals:
        cells = "".join(f"<td>{fmt.format(e[k]) if isinstance(e.get(k), (int, float)) else ''}</td>" for k, _, fmt in cols)
        rows.append(f"<tr>{cells}</tr>")
    body = "".join(rows) or f"<tr><td colspan={len(cols)}>no evaluation in this run</td></tr>"
    return f"<table id='evals'><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def write_html_report(run_dir: Path, records: list[dict[str, Any]], out: Path) -> Path:
    """Write ``out/index.html`` for the run at ``run_dir`` with metric ``records``; its path."""
    from plotly.offline import get_plotlyjs

    steps = [r for r in records if r.get("kind") == "step"]
    evals = [r for r in records if r.get("kind") == "eval"]
    warnings = [r["message"] for r in records if r.get("kind") == "event" and r.get("warning")]
    episodes, total = _episodes(run_dir)
    data = {"figures": _figures(steps, evals), "episodes": episodes, "total": total, "run": run_dir.name}
    parts = {
        "TITLE": html.escape(run_dir.name),
        "EVALS": _eval_table(evals),
        "WARNINGS": "".join(f"<li>{html.escape(w)}</li>" for w in warnings[:50]) or "<li>none</li>",
        "PLOTLY": get_plotlyjs(),
        "DATA": json.dumps(data, ensure_ascii=False).replace("</", "<\\/"),  # no "</script>" inside the JSON
    }
    page = re.sub(r"%(TITLE|EVALS|WARNINGS|PLOTLY|DATA)%", lambda m: parts[m.group(1)], _TEMPLATE)  # one pass: nothing inserted is re-read
    path = out / "index.html"
    path.write_text(page, encoding="utf-8")
    return path


_TEMPLATE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>agentrl run %TITLE%</title>
<style>
body { font: 14px/1.45 system-ui, sans-serif; margin: 0 auto; max-width: 1200px; padding: 1em 2em; color: #222; }
h1 { font-size: 1.4em; } h2 { font-size: 1.15em; margin-top: 1.6em; border-bottom: 1px solid #ddd; }
#figures { display: grid; grid-template-columns: 1fr 1fr; gap: 8px; }
table { border-collapse: collapse; } th, td { border: 1px solid #ddd; padding: 3px 8px; text-align: right; }
#filters { display: flex; gap: 1em; flex-wrap: wrap; align-items: center; margin: .5em 0; }
#filters input { width: 5em; }
.episode { border: 1px solid #ccc; border-radius: 6px; margin: .8em 0; padding: .4em .8em; }
.episode header { display: flex; gap: 1.2em; font-weight: 600; }
.status-ok { color: #1a7f37; } .status-infra_failure, .status-agent_failure { color: #c62828; }
.error { white-space: pre-wrap; font-family: monospace; font-size: 12px; color: #c62828; }
.turn { margin: .3em 0; padding: .2em .5em; border-left: 4px solid #bbb; white-space: pre-wrap; font-family: ui-monospace, monospace; font-size: 12.5px; }
.turn .role { font-family: system-ui, sans-serif; font-weight: 600; font-size: 11px; text-transform: uppercase; color: #555; display: block; }
.role-system { border-color: #999; background: #fafafa; } .role-user { border-color: #1565c0; }
.role-assistant { border-color: #2e7d32; } .role-tool { border-color: #ef6c00; background: #fff6ec; }
.call { outline: 1px dashed #ef6c00; border-radius: 3px; }
.tok { border-radius: 2px; } .legend span { padding: 0 .4em; margin-right: .3em; border-radius: 3px; }
#pager button { margin: 0 .3em; }
</style></head>
<body>
<h1>agentrl run <code>%TITLE%</code></h1>
<h2>Training curves</h2>
<div id="figures"></div>
<h2>Evaluations</h2>
%EVALS%
<h2>Warnings</h2>
<ul id="warnings">%WARNINGS%</ul>
<h2>Trajectories</h2>
<p id="shown"></p>
<div id="filters">
  <label>source <select id="f-source"><option value="">all</option><option>train</option><option>eval</option></select></label>
  <label>step from <input id="f-step-min" type="number"></label><label>to <input id="f-step-max" type="number"></label>
  <label>reward from <input id="f-rew-min" type="number" step="any"></label><label>to <input id="f-rew-max" type="number" step="any"></label>
  <label>status <select id="f-status"><option value="">all</option></select></label>
</div>
<p class="legend" id="legend"></p>
<div id="pager"></div>
<div id="episodes"></div>
<script>%PLOTLY%</script>
<script id="data" type="application/json">%DATA%</script>
<script>
"use strict";
const DATA = JSON.parse(document.getElementById("data").textContent);
const PAGE = 20;
let page = 0;
DATA.figures.forEach((fig, i) => {
  const div = document.createElement("div");
  div.id = "fig" + i;
  document.getElementById("figures").appendChild(div);
  Plotly.newPlot(div, fig.data, fig.layout, {displaylogo: false, displayModeBar: "hover", responsive: true});
});
const versions = [...new Set(DATA.episodes.flatMap(e => e.turns.flatMap(t => t.pieces.map(p => p[1]))))].filter(v => v >= 0).sort((a, b) => a - b);
const maxV = Math.max(1, ...versions);
function colour(v) { return `hsl(${Math.round(260 - 220 * v / maxV)}, 85%, 82%)`; }
const legend = document.getElementById("legend");
legend.textContent = versions.length ? "token colour = the weight version that sampled it (plain: prompt, tool output, template): "
  : "these samples carry no per-token versions (written by an older agentrl)";
(versions.length ? [versions[0], versions[Math.floor(versions.length / 2)], versions[versions.length - 1]] : []).filter((v, i, a) => a.indexOf(v) === i).forEach(v => {
  const s = document.createElement("span"); s.style.background = colour(v); s.textContent = "v" + v; legend.appendChild(s);
});
const statuses = [...new Set(DATA.episodes.map(e => e.status))].sort();
statuses.forEach(s => { const o = document.createElement("option"); o.textContent = s; document.getElementById("f-status").appendChild(o); });
function num(id) { const v = document.getElementById(id).value; return v === "" ? null : Number(v); }
function filtered() {
  const src = document.getElementById("f-source").value, st = document.getElementById("f-status").value;
  const s0 = num("f-step-min"), s1 = num("f-step-max"), r0 = num("f-rew-min"), r1 = num("f-rew-max");
  return DATA.episodes.filter(e => (!src || e.source === src) && (!st || e.status === st)
    && (s0 === null || e.step >= s0) && (s1 === null || e.step <= s1) && (r0 === null || e.reward >= r0) && (r1 === null || e.reward <= r1));
}
function renderEpisode(e) {
  const box = document.createElement("section"); box.className = "episode";
  const head = document.createElement("header");
  [["source", e.source], ["step", e.step], ["group", e.group], ["reward", e.reward.toFixed(3)], ["status", e.status]].forEach(([k, v]) => {
    const s = document.createElement("span"); s.textContent = `${k} ${v}`; if (k === "status") s.className = "status-" + v; head.appendChild(s);
  });
  box.appendChild(head);
  if (e.error) { const pre = document.createElement("div"); pre.className = "error"; pre.textContent = e.error; box.appendChild(pre); }
  e.turns.forEach(t => {
    const div = document.createElement("div"); div.className = "turn role-" + t.role;
    const role = document.createElement("span"); role.className = "role"; role.textContent = t.role; div.appendChild(role);
    t.pieces.forEach(([text, v, inCall]) => {
      const s = document.createElement("span"); s.textContent = text;
      if (v >= 0) { s.className = "tok"; s.dataset.v = v; s.style.background = colour(v); s.title = "weight version " + v; }
      if (inCall) s.classList.add("call");
      div.appendChild(s);
    });
    box.appendChild(div);
  });
  return box;
}
function render() {
  const list = filtered(), pages = Math.max(1, Math.ceil(list.length / PAGE));
  page = Math.min(page, pages - 1);
  document.getElementById("shown").textContent = `${list.length} episodes match (${DATA.episodes.length} embedded of ${DATA.total} in the samples files); page ${page + 1} of ${pages}`;
  const pager = document.getElementById("pager"); pager.replaceChildren();
  [["« first", 0], ["‹ previous", page - 1], ["next ›", page + 1], ["last »", pages - 1]].forEach(([label, p]) => {
    const b = document.createElement("button"); b.textContent = label; b.disabled = p < 0 || p >= pages || p === page;
    b.onclick = () => { page = p; render(); }; pager.appendChild(b);
  });
  const out = document.getElementById("episodes"); out.replaceChildren();
  list.slice(page * PAGE, (page + 1) * PAGE).forEach(e => out.appendChild(renderEpisode(e)));
}
document.querySelectorAll("#filters input, #filters select").forEach(el => ["input", "change"].forEach(ev => el.addEventListener(ev, () => { page = 0; render(); })));
render();
</script>
</body></html>
"""
