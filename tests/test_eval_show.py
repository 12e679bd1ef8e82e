"""``agentrl eval RECIPE [--show N]``: the evaluation is a run of its own in
``RUN_DIR/evals/<date-time>/`` (the training run's summary.json and metrics.jsonl stay byte for
byte as they were); with ``--show N`` its episodes are printed turn by turn (roles, tool calls,
reward, status, error), at least N rows evaluated and N written. The evaluation itself runs for
real in tests/e2e/test_eval_show_e2e.py; here the CLI's seam to the run (``_train``, or the
``Controller`` under it) is replaced."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import agentrl.cli as cli
from agentrl.config import load_recipe
from agentrl.episode_show import read_episodes, render_episode

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


def test_a_line_cut_by_a_crash_is_left_out(tmp_path):
    path = tmp_path / "eval_samples.jsonl"
    assert read_episodes(path) == []
    path.write_text(json.dumps(_record(0.0)) + "\n" + json.dumps(_record(1.0)) + "\n" + '{"version": 0, "cut by a cra')
    assert [r["reward"] for r in read_episodes(path)] == [0.0, 1.0]


def _eval_dirs(run_dir: Path) -> list[Path]:
    return sorted((run_dir / "evals").iterdir()) if (run_dir / "evals").is_dir() else []


@pytest.mark.parametrize(("limit", "show", "expected_limit"), [(2, 3, "eval.limit=3"), (8, 3, None), (0, 3, None)])
def test_show_evaluates_at_least_n_rows_writes_n_and_prints_them(tmp_path, monkeypatch, capsys, limit, show, expected_limit):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "eval_samples.jsonl").write_text(json.dumps({**_record(), "status": "from an earlier run"}) + "\n")
    seen = {}

    def fake_train(args, hooks=()):  # writes where the controller would: the recipe's run_dir, as overridden
        seen["overrides"] = list(args.overrides)
        out = load_recipe(args.recipe, args.overrides).resolved_run_dir()
        (out / "metrics.jsonl").write_text(json.dumps({"kind": "eval", "time": 3.0, "version": 0, "accuracy": 0.4,
                                                       "tool_call_rate": 1.0, "turns_mean": 2.0, "episodes": 5.0}) + "\n")
        with (out / "eval_samples.jsonl").open("a") as f:
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
    assert "from an earlier run" not in out  # the training run's episodes are not this evaluation's
    [eval_dir] = _eval_dirs(run_dir)
    assert overrides[-1] == f"run_dir={str(eval_dir)!r}"
    # and in the report's trajectory browser, written for them in the evaluation's own folder
    assert out.splitlines()[-1] == (f"evaluation written to {eval_dir} (summary.json, metrics.jsonl, eval_samples.jsonl); "
                                    f"report (plots, the trajectory browser): {eval_dir / 'report' / 'index.html'}")
    assert "Compute 12*34+5." in (eval_dir / "report" / "index.html").read_text()
    assert not (run_dir / "report").exists()


def test_a_checkpoint_is_evaluated_in_place_of_the_recipes_model(tmp_path, monkeypatch):
    seen = {}
    monkeypatch.setattr(cli, "_train", lambda args, hooks=(): seen.setdefault("overrides", list(args.overrides)) and 0)
    assert cli.main(["eval", str(REPO / "recipes" / "tiny_calc.toml"), "--checkpoint", "runs/x/final", "--set", f"run_dir='{tmp_path}'"]) == 0
    [eval_dir] = _eval_dirs(tmp_path)
    assert seen["overrides"][-4:] == ["mode=eval", "sft.steps=0", "model.path='runs/x/final'", f"run_dir={str(eval_dir)!r}"]


def test_the_evaluator_writes_as_many_decoded_episodes_as_asked_with_turns_and_tool_calls(tmp_path, tiny_calc_model):
    """A real rollout worker (Calc-v0 on a scripted generator, its sandbox faked) behind the
    evaluator: ``samples`` episodes reach eval_samples.jsonl, each decoded and counted, and
    they render as the CLI prints them."""
    import anyio

    from agentrl.engine.episodes.rollout import RolloutWorker
    from agentrl.engine.episodes.runner import EpisodeSettings
    from agentrl.engine.loop.evaluation import Evaluator
    from agentrl.engine.metrics import MetricsLogger
    from agentrl.engine.testing import ScriptedGenerator, local_actor
    from agentrl.envs.data import load_rows
    from agentrl.models.loading import load_tokenizer
    from agentrl.sandbox.testing import FakeSandbox

    tok = load_tokenizer(str(tiny_calc_model))
    gen = ScriptedGenerator(tok, lambda prompt, s: "\\boxed{7}" if prompt.count("<interpreter>") >= 2 else "<code>3+4</code>")  # the system prompt names it once
    worker = RolloutWorker(
        episodes=EpisodeSettings(
            tokenizer=str(tiny_calc_model), env_id="agentrl/Calc-v0", env_kwargs={"sandbox": FakeSandbox()}, sandbox_kind=None,
            sandbox_kwargs={}, sampling={}, max_new_tokens=16, max_episode_tokens=512, seed=0,
        ),
        generators=[gen], max_concurrent_episodes=4, generate_timeout_s=10,
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
        out = load_recipe(args.recipe, args.overrides).resolved_run_dir()
        (out / "eval_samples.jsonl").write_text(json.dumps(_record()) + "\n")
        return 0

    monkeypatch.setattr(cli, "_train", fake_train)
    assert cli.main(["eval", str(REPO / "recipes" / "tiny_calc.toml"), "--show", "1", "--set", f"run_dir='{run_dir}'"]) == 0
    out = capsys.readouterr().out
    assert "── episode 1 of 1 · reward 1.000 · ok" in out
    [eval_dir] = _eval_dirs(run_dir)
    assert out.splitlines()[-1].startswith(f"evaluation written to {eval_dir} (summary.json, metrics.jsonl, eval_samples.jsonl); "
                                           f"no report written ({eval_dir / 'metrics.jsonl'}: no metrics"), out


class _EvalOnlyController:
    """The controller's seam for ``agentrl eval``: what the real one writes in mode eval (the
    recipe, the evaluation record through a real MetricsLogger, the decoded episodes and
    summary.json), into the recipe's run directory as the CLI hands it over."""

    def __init__(self, recipe, *, hooks=(), fresh=False, resume_from=None):
        from agentrl.engine.common.run_dir import RunDir

        assert recipe.mode == "eval" and not fresh and resume_from is None
        self.recipe, self.run_dir = recipe, RunDir(recipe.resolved_run_dir())

    def run(self):
        from agentrl.engine.common.summary import RunSummary, write_summary
        from agentrl.engine.metrics import MetricsLogger

        rd = self.run_dir
        rd.root.mkdir(parents=True, exist_ok=True)
        rd.recipe.write_text(json.dumps(self.recipe.model_dump(mode="json")))
        log = MetricsLogger(rd.root, live=False)
        record = log.log("eval", version=0, accuracy=0.25, tool_call_rate=1.0, turns_mean=2.0, episodes=4.0)
        log.close()
        with rd.eval_samples.open("a") as f:
            f.write(json.dumps(_record(0.25)) + "\n")
        summary = RunSummary(rd.root, 0, 0, Path(self.recipe.model.path), 0, 0, 0)
        write_summary(rd.summary, summary, [record])
        return summary


def test_an_evaluation_never_touches_the_training_runs_files(tmp_path, monkeypatch, capsys):
    """The training run's summary.json, metrics.jsonl and eval_samples.jsonl are byte for byte
    as they were after ``agentrl eval`` (plain and --show) and ``agentrl.evaluate``; each
    evaluation has its own folder under RUN_DIR/evals with its own files, named on the last line."""
    import agentrl
    import agentrl.engine.controller as controller

    run_dir = tmp_path / "run"
    (run_dir / "checkpoints").mkdir(parents=True)
    training = {
        "summary.json": json.dumps({"steps": 40, "eval_after": {"accuracy": 0.75}}, indent=2),
        "metrics.jsonl": "".join(json.dumps({"kind": k, "time": float(i), "version": i}) + "\n" for i, k in enumerate(["step", "step", "eval"])),
        "eval_samples.jsonl": json.dumps(_record(1.0)) + "\n",
    }
    for name, text in training.items():
        (run_dir / name).write_text(text)
    before = {name: (run_dir / name).read_bytes() for name in training}
    monkeypatch.setattr(controller, "Controller", _EvalOnlyController)
    recipe = str(REPO / "recipes" / "tiny_calc.toml")

    assert cli.main(["eval", recipe, "--checkpoint", str(run_dir / "final"), "--set", f"run_dir='{run_dir}'"]) == 0
    assert cli.main(["eval", recipe, "--show", "1", "--set", f"run_dir='{run_dir}'"]) == 0
    summary = agentrl.evaluate(recipe, run_dir / "final", run_dir=str(run_dir))

    assert {name: (run_dir / name).read_bytes() for name in training} == before
    assert sorted(p.name for p in run_dir.iterdir()) == ["checkpoints", "eval_samples.jsonl", "evals", "metrics.jsonl", "summary.json"]
    dirs = _eval_dirs(run_dir)
    assert len(dirs) == 3 and summary.run_dir == dirs[2]
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("evaluation written to ")]
    assert [line.split()[3] for line in lines] == [str(d) for d in dirs[:2]]
    for d in dirs:
        assert json.loads((d / "summary.json").read_text())["eval_after"]["accuracy"] == 0.25
        assert [json.loads(line)["kind"] for line in (d / "metrics.jsonl").read_text().splitlines()] == ["eval"]
        assert len(read_episodes(d / "eval_samples.jsonl")) == 1
    assert [(d / "report" / "index.html").is_file() for d in dirs] == [True, True, False]  # the CLI writes the report


def test_an_evaluation_before_training_makes_no_earlier_run(tmp_path):
    """``RUN_DIR/evals`` alone (``agentrl eval --show`` before the first ``agentrl train``) is no
    earlier run: training starts at step 0 in RUN_DIR with nothing renamed aside; with a
    finished run, the evaluations go aside with it."""
    from agentrl.engine.common.run_dir import RunDir
    from agentrl.engine.run_start import plan_start

    rd = RunDir(tmp_path / "run")
    first = rd.new_eval_dir()
    second = rd.new_eval_dir()
    assert first.parent == second.parent == rd.evals and first != second and not any(first.iterdir())
    plan = plan_start(rd)
    assert (plan.checkpoint, plan.message) == (None, "") and first.is_dir()
    rd.summary.write_text("{}")
    plan = plan_start(rd)
    assert "held a finished run" in plan.message and not rd.root.exists()


def test_an_evaluation_refused_before_it_wrote_anything_leaves_no_folder(tmp_path, monkeypatch):
    from agentrl.errors import ConfigError

    def refuse(args, hooks=()):
        raise ConfigError("no such model")

    monkeypatch.setattr(cli, "_train", refuse)
    assert cli.main(["eval", str(REPO / "recipes" / "tiny_calc.toml"), "--set", f"run_dir='{tmp_path}'"]) == 2
    assert list((tmp_path / "evals").iterdir()) == []
