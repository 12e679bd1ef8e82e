"""``agentrl eval RECIPE --show N``: the episodes of the evaluation printed turn by turn (roles,
tool calls, reward, status, error), the run's own block of ``eval_samples.jsonl`` only, at least N
rows evaluated and N written. The evaluation itself runs for real in
tests/e2e/test_eval_show_e2e.py; here the CLI's seam to the run (``_train``) is replaced."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import agentrl.cli as cli
from agentrl.episode_show import count_lines, read_episodes, render_episode

REPO = Path(__file__).resolve().parents[1]

CALC = (
    "<|im_start|>system\nYou solve arithmetic problems [with a Python interpreter].<|im_end|>\n"
    "<|im_start|>user\nCompute 12*34+5.<|im_end|>\n<|im_start|>assistant\n"
)


def _record(reward: float = 1.0, status: str = "ok", **extra) -> dict:
    spans = [[CALC, -1], ["<code>12*34+5</code>", 0], ["<|im_end|>\n<|im_start|>tool\n<interpreter>\n413\n</interpreter><|im_end|>\n"
                                                        "<|im_start|>assistant\n", -1], ["\\boxed{413}<|im_end|>", 1]]
    return {"version": 0, "group_id": "eval0", "reward": reward, "status": status, "turns": 2, "tool_calls": 1,
            "text": "".join(t for t, _ in spans), "spans": spans, **extra}


def test_an_episode_renders_turn_by_turn_with_its_tool_call_and_reward():
    text = render_episode(_record(), 1, 3)
    assert text.splitlines() == [
        "── episode 1 of 3 · reward 1.000 · ok · 2 turns, 1 tool call ──",
        "system     You solve arithmetic problems [with a Python interpreter].",  # brackets printed as written
        "user       Compute 12*34+5.",
        "assistant  ▶ tool call: <code>12*34+5</code>",
        "tool       <interpreter>",
        "           413",
        "           </interpreter>",
        "assistant  \\boxed{413}",
    ]


def test_a_failed_episode_shows_its_error_and_a_template_without_markers_one_block():
    text = render_episode(_record(0.0, "infra_failure", error="SandboxError: the sandbox died"), 2, 2)
    assert text.splitlines()[0] == "── episode 2 of 2 · reward 0.000 · infra_failure · 2 turns, 1 tool call ──"
    assert text.splitlines()[-1] == "error      SandboxError: the sandbox died"
    plain = render_episode({"reward": 0.5, "status": "ok", "text": "Q: 2+2?\nA: 4"}, 1, 1)
    assert plain.splitlines() == ["── episode 1 of 1 · reward 0.500 · ok ──", "           Q: 2+2?", "           A: 4"]


def test_only_the_lines_after_the_earlier_runs_are_read(tmp_path):
    path = tmp_path / "eval_samples.jsonl"
    assert count_lines(path) == 0 and read_episodes(path) == []
    path.write_text(json.dumps(_record(0.0)) + "\n")
    before = count_lines(path)
    with path.open("a") as f:
        f.write(json.dumps(_record(1.0)) + "\n" + '{"version": 0, "cut by a cra')
    assert [r["reward"] for r in read_episodes(path, skip=before)] == [1.0]


@pytest.mark.parametrize(("limit", "show", "expected_limit"), [(2, 3, "eval.limit=3"), (8, 3, None), (0, 3, None)])
def test_show_evaluates_at_least_n_rows_writes_n_and_prints_them(tmp_path, monkeypatch, capsys, limit, show, expected_limit):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "eval_samples.jsonl").write_text(json.dumps({**_record(), "status": "from an earlier run"}) + "\n")
    seen = {}

    def fake_train(args, hooks=()):
        seen["overrides"] = list(args.overrides)
        (run_dir / "metrics.jsonl").write_text(json.dumps({"kind": "eval", "time": 3.0, "version": 0, "accuracy": 0.4,
                                                           "tool_call_rate": 1.0, "turns_mean": 2.0, "episodes": 5.0}) + "\n")
        with (run_dir / "eval_samples.jsonl").open("a") as f:
            for i in range(5):
                f.write(json.dumps(_record(reward=float(i))) + "\n")
        return 0

    monkeypatch.setattr(cli, "_train", fake_train)
    recipe = str(REPO / "recipes" / "tiny_calc.toml")
    status = cli.main(["eval", recipe, "--show", str(show), "--set", f"run_dir='{run_dir}'", "--set", f"eval.limit={limit}"])
    assert status == 0
    overrides = seen["overrides"]
    assert "mode=eval" in overrides and "sft.steps=0" in overrides and f"eval.samples={max(4, show)}" in overrides
    assert not any(o.startswith("model.path=") for o in overrides)  # no --checkpoint: the recipe's own model
    assert (expected_limit in overrides) if expected_limit else not any(o.startswith("eval.limit=") and o != f"eval.limit={limit}" for o in overrides)
    out = capsys.readouterr().out
    headers = [line for line in out.splitlines() if line.startswith("── episode")]
    assert headers == [f"── episode {i + 1} of {show} · reward {float(i):.3f} · ok · 2 turns, 1 tool call ──" for i in range(show)]
    assert "from an earlier run" not in out  # the earlier run's episodes are not this evaluation's
    # and in the report's trajectory browser, written for them
    assert out.splitlines()[-1].endswith(f"and in the trajectory browser of {run_dir / 'report' / 'index.html'}")
    assert "Compute 12*34+5." in (run_dir / "report" / "index.html").read_text()


def test_a_checkpoint_is_evaluated_in_place_of_the_recipes_model(tmp_path, monkeypatch):
    seen = {}
    monkeypatch.setattr(cli, "_train", lambda args, hooks=(): seen.setdefault("overrides", list(args.overrides)) and 0)
    assert cli.main(["eval", str(REPO / "recipes" / "tiny_calc.toml"), "--checkpoint", "runs/x/final", "--set", f"run_dir='{tmp_path}'"]) == 0
    assert seen["overrides"][-3:] == ["mode=eval", "sft.steps=0", "model.path='runs/x/final'"]


def test_the_evaluator_writes_as_many_decoded_episodes_as_asked_with_turns_and_tool_calls(tmp_path, tiny_calc_model):
    """A real rollout worker (Calc-v0 on a scripted generator, its sandbox faked) behind the
    evaluator: ``samples`` episodes reach eval_samples.jsonl, each decoded and counted, and
    they render as the CLI prints them."""
    import anyio

    from agentrl.engine.episodes.rollout import RolloutWorker
    from agentrl.engine.loop.evaluation import Evaluator
    from agentrl.engine.metrics import MetricsLogger
    from agentrl.engine.testing import ScriptedGenerator, local_actor
    from agentrl.envs.data import load_rows
    from agentrl.models.loading import load_tokenizer
    from tests.envs.envfakes import FakeSandbox

    tok = load_tokenizer(str(tiny_calc_model))
    gen = ScriptedGenerator(tok, lambda prompt, s: "\\boxed{7}" if prompt.count("<interpreter>") >= 2 else "<code>3+4</code>")  # the system prompt names it once
    worker = RolloutWorker(
        model=str(tiny_calc_model), env_id="agentrl/Calc-v0", env_kwargs={"sandbox": FakeSandbox()}, sandbox_kind=None,
        sandbox_kwargs={}, generators=[gen], sampling={}, max_new_tokens=16, max_episode_tokens=512,
        max_concurrent_episodes=4, generate_timeout_s=10, seed=0,
    )
    handle = local_actor(worker, "rollout-0")
    rows = load_rows("synthetic:calc", split="test", limit=6)
    path = tmp_path / "eval_samples.jsonl"
    log = MetricsLogger(tmp_path, live=False)
    evaluator = Evaluator(workers=lambda: [handle], rows=rows, temperature=0.0, timeout_s=60, log=log, samples_path=path, samples=5)
    anyio.run(evaluator, 0)
    log.close()
    episodes = read_episodes(path)
    assert len(episodes) == 5  # not the 4 it always wrote
    assert all(e["turns"] == 2 and e["tool_calls"] == 1 and e["text"] and e["spans"] for e in episodes), episodes
    shown = render_episode(episodes[0], 1, 5)
    assert "assistant  ▶ tool call: <code>3+4</code>" in shown and "assistant  \\boxed{7}" in shown, shown


def test_without_metrics_to_report_on_the_episodes_are_still_shown_and_the_report_is_said_missing(tmp_path, monkeypatch, capsys):
    run_dir = tmp_path / "run"

    def fake_train(args, hooks=()):
        run_dir.mkdir()
        (run_dir / "eval_samples.jsonl").write_text(json.dumps(_record()) + "\n")
        return 0

    monkeypatch.setattr(cli, "_train", fake_train)
    assert cli.main(["eval", str(REPO / "recipes" / "tiny_calc.toml"), "--show", "1", "--set", f"run_dir='{run_dir}'"]) == 0
    out = capsys.readouterr().out
    assert "── episode 1 of 1 · reward 1.000 · ok" in out
    assert f"no report written ({run_dir / 'metrics.jsonl'}: no metrics" in out.splitlines()[-1], out
