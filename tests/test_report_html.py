"""The HTML report: turns and version spans (unit), and the page itself in headless Chromium."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from agentrl.report import write_report
from agentrl.report_html import MAX_EPISODES, episode_turns
from tests.browser import chromium, open_page

SYSTEM = "<|im_start|>system\nUse the tool.<|im_end|>\n<|im_start|>user\nCompute 2+3.<|im_end|>\n<|im_start|>assistant\n"


def spans_with_an_update_mid_turn() -> list[list]:
    """An episode whose first turn was written by versions 3 then 4 (an in-flight update)."""
    return [
        [SYSTEM, -1], ["<code>print(", 3], ["2+3)</code>", 4], ["<|im_end|>\n<|im_start|>tool\n5\n<|im_end|>\n<|im_start|>assistant\n", -1],
        ["\\boxed{5}<|im_end|>", 4],
    ]


def test_turns_keep_the_version_of_every_piece_and_set_tool_calls_apart():
    turns = episode_turns(spans_with_an_update_mid_turn())
    assert [t["role"] for t in turns] == ["system", "user", "assistant", "tool", "assistant"]
    first = turns[2]["pieces"]
    assert [(text, v) for text, v, _ in first if v >= 0] == [("<code>print(", 3), ("2+3)</code>", 4)]
    assert all(c == 1 for text, v, c in first if v >= 0) and first[-1][2] == 0  # the call, then the end of turn
    assert "".join(p[0] for t in turns for p in t["pieces"]) == "".join(s[0] for s in spans_with_an_update_mid_turn())
    assert episode_turns([["no chat markers here", 2]]) == [{"role": "text", "pieces": [["no chat markers here", 2, 0]]}]


def fake_run(root: Path, episodes: int) -> Path:
    """A run directory as a run writes it: steps, evaluations, a warning, ``episodes`` samples."""
    root.mkdir(parents=True)
    records = [{"kind": "eval", "time": 0.0, "version": 0, "accuracy": 0.4, "reward_mean": 0.4, "tool_call_rate": 0.7,
                "turns_mean": 1.8, "episodes": 128.0, "infra_failures": 0.0, "agent_failures": 0.0}]
    for s in range(1, 11):
        records.append({"kind": "step", "time": float(s), "step": s, "version": s, "reward_mean": 0.4 + s / 40, "gen_tokens_per_s": 500.0,
                        "train_tokens_per_s": 1500.0, "staleness_hist": {"0": 8, "1": 24}, "loss": -0.1, "grad_norm": 0.3,
                        "dropped_stale": 0, "infra_failures": 0,
                        # dynamic sampling under refill: 8 groups a batch, some set aside each step
                        "groups_sampled": 8 + s % 3 + 1, "groups_with_signal": 8, "set_aside_solved": s % 3, "set_aside_failed": 1,
                        "refill_factor": (8 + s % 3 + 1) / 8})
    records.append({"kind": "event", "time": 11.0, "message": "step 3 is degenerate: every one of the 8 groups had equal rewards", "warning": True})
    records.append({"kind": "eval", "time": 12.0, "version": 10, "accuracy": 0.7, "reward_mean": 0.7, "tool_call_rate": 0.9,
                    "turns_mean": 1.9, "episodes": 128.0, "infra_failures": 0.0, "agent_failures": 0.0})
    (root / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in records) + "\n")
    with (root / "samples.jsonl").open("w") as f:
        for i in range(episodes):
            failed = i % 50 == 7
            f.write(json.dumps({"version": 1 + i % 10, "group_id": f"p{i}", "reward": float(i % 2), "status": "agent_failure" if failed else "ok",
                                "error": "Traceback (most recent call last):\n  ValueError: boom" if failed else "",
                                "text": "".join(s[0] for s in spans_with_an_update_mid_turn()), "spans": spans_with_an_update_mid_turn()}) + "\n")
    return root


PAGE_DRAWN = "document.readyState === 'complete' && document.getElementById('shown').textContent !== ''"
"""True once the page's script ran to its end (its last act writes the episode count into #shown)."""

FIGURES_JS = """
return [...document.querySelectorAll('#figures > div')].map(fig => ({
  plotly: fig.classList.contains('js-plotly-plot'),
  svgs: fig.querySelectorAll('svg.main-svg').length,
  title: (fig.querySelector('.gtitle') || {textContent: null}).textContent,
  drawn: [...fig.querySelectorAll('.scatterlayer .trace, .barlayer .trace')].map(
    trace => [...trace.querySelectorAll('path')].filter(p => (p.getAttribute('d') || '').length > 10).length),
}));
"""
"""Per figure container: drawn by Plotly, its own SVGs, its title, and per data trace the number of
paths it drew with real geometry (a line, markers, bars)."""


@pytest.mark.browser
def test_the_page_renders_curves_and_coloured_trajectories_in_chromium(tmp_path):
    run = fake_run(tmp_path / "run", 60)
    page = write_report(run) / "index.html"
    with chromium() as browser:
        open_page(browser, page.as_uri(), PAGE_DRAWN)
        figures = browser.execute_script(FIGURES_JS)
        assert [f["title"] for f in figures] == [
            "reward, accuracy", "throughput (tokens/s)", "staleness (versions behind)", "loss, grad norm",
            "dynamic sampling (groups per step)"]
        assert all(f["plotly"] and f["svgs"] >= 1 for f in figures), figures  # every figure drew its own SVG
        # ... with every data trace drawn: 3 curves, 2, 2 stacked bar series (0 and 1 behind), 2, 2 bar series and 3 curves
        assert [len(f["drawn"]) for f in figures] == [3, 2, 2, 2, 5], figures
        assert all(n > 0 for f in figures for n in f["drawn"]), figures
        tokens = browser.find_elements("css selector", ".episode .tok")
        assert {t.get_attribute("data-v") for t in tokens} >= {"3", "4"}
        assert tokens[0].value_of_css_property("background-color") != tokens[1].value_of_css_property("background-color")
        assert browser.find_elements("css selector", ".episode .turn.role-tool") and browser.find_elements("css selector", ".episode .call")
        assert len(browser.find_elements("css selector", ".episode")) == 20  # one page
        assert "60 episodes match" in browser.find_element("id", "shown").text
        assert "degenerate" in browser.find_element("id", "warnings").text
        assert len(browser.find_elements("css selector", "#evals tbody tr")) == 2
        # filters: status, then a reward range
        from selenium.webdriver.support.ui import Select

        Select(browser.find_element("id", "f-status")).select_by_visible_text("agent_failure")
        assert "2 episodes match" in browser.find_element("id", "shown").text
        assert "ValueError: boom" in browser.find_element("css selector", ".episode .error").text
        Select(browser.find_element("id", "f-status")).select_by_visible_text("all")
        browser.find_element("id", "f-rew-min").send_keys("1")
        assert "30 episodes match" in browser.find_element("id", "shown").text
        browser.save_screenshot(str(tmp_path / "report.png"))
        errors = [entry for entry in browser.get_log("browser") if entry["level"] == "SEVERE"]
    assert errors == []
    assert (tmp_path / "report.png").stat().st_size > 10_000


@pytest.mark.browser
def test_a_samples_file_of_10000_episodes_is_sampled_and_opens(tmp_path):
    run = fake_run(tmp_path / "run", 10_000)
    page = write_report(run) / "index.html"
    with chromium() as browser:
        t0 = time.monotonic()
        open_page(browser, page.as_uri(), PAGE_DRAWN)
        load_s = time.monotonic() - t0
        shown = browser.find_element("id", "shown").text
        errors = [entry for entry in browser.get_log("browser") if entry["level"] == "SEVERE"]
    print(f"10,000-episode samples file: page loaded and drawn in {load_s:.2f} s")  # measured in benchmarks/report_page.py
    assert f"{MAX_EPISODES} embedded of 10000" in shown and errors == []


def test_dynamic_sampling_is_reported_when_the_run_logged_it(tmp_path):
    """The summary's dynamic-sampling line and the page's figure (issue 39): present for a run
    whose steps carry the counts, absent for one whose steps do not."""
    from agentrl.report_html import _figures

    run = fake_run(tmp_path / "run", 4)
    out = write_report(run)
    summary = (out / "summary.md").read_text()
    # steps 1..10: groups sampled 8 + s % 3 + 1, set aside s % 3 solved and 1 failed
    assert "- dynamic sampling: 100 groups sampled, 80 with a learning signal trained; set aside 10 solved, 10 failed" in summary
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if r["kind"] == "step"]
    fig = _figures(steps, [])[-1]
    assert fig["layout"]["title"]["text"] == "dynamic sampling (groups per step)"
    assert [t["name"] for t in fig["data"]] == ["set aside: solved", "set aside: failed", "groups sampled", "groups with signal",
                                               "refill factor (sampled / batch groups)"]
    assert fig["data"][2]["y"] == [8 + s % 3 + 1 for s in range(1, 11)]
    old = [{k: v for k, v in r.items() if k not in ("groups_sampled", "groups_with_signal", "set_aside_solved", "set_aside_failed",
                                                    "refill_factor")} for r in steps]
    assert "dynamic sampling" not in json.dumps([f["layout"].get("title") for f in _figures(old, [])])
