"""Where a training run starts (agentrl.engine.run_start): resume, --fresh, --resume-from, and an
earlier run set aside with a plain sentence."""

from __future__ import annotations

from pathlib import Path

import pytest

from agentrl.engine.common.run_dir import RunDir
from agentrl.engine.loop.run_state import RunState, write_checkpoint_state
from agentrl.engine.loop.staleness import QueueStats
from agentrl.engine.run_start import plan_start
from agentrl.errors import ConfigError


def _checkpoint(rd: RunDir, version: int) -> Path:
    folder = rd.checkpoint(version)
    (folder / "learner").mkdir(parents=True)
    (folder / "learner" / "model.bin").write_text(f"v{version}")
    write_checkpoint_state(folder, RunState(version=version, cursor=0, reissue=[], queued=[], stats=QueueStats()))
    return folder


def _run(tmp_path: Path, *versions: int, finished: bool = False) -> RunDir:
    rd = RunDir(tmp_path / "run")
    rd.root.mkdir(parents=True)
    rd.metrics.write_text('{"kind": "step", "step": 1}\n')
    for v in versions:
        _checkpoint(rd, v)
    if finished:
        rd.summary.write_text("{}")
    return rd


def _aside(tmp_path: Path) -> list[Path]:
    return sorted(tmp_path.glob("run.old-*"))


def test_a_new_run_directory_starts_at_step_zero_silently(tmp_path):
    plan = plan_start(RunDir(tmp_path / "run"))
    assert plan.checkpoint is None and plan.message == ""


def test_an_unfinished_run_resumes_from_its_newest_checkpoint(tmp_path):
    rd = _run(tmp_path, 1, 4)
    assert plan_start(rd).checkpoint == rd.checkpoint(4)
    assert not _aside(tmp_path)


def test_an_earlier_run_without_a_checkpoint_is_set_aside_and_said(tmp_path):
    rd = _run(tmp_path)
    plan = plan_start(rd)
    assert plan.checkpoint is None
    [old] = _aside(tmp_path)
    assert (old / "metrics.jsonl").is_file() and not rd.root.exists()
    assert "stopped before its first checkpoint" in plan.message and "starts over at step 0" in plan.message and str(old) in plan.message


def test_a_finished_sft_stage_of_a_run_without_a_checkpoint_is_reused(tmp_path):
    rd = _run(tmp_path)
    rd.sft.mkdir()
    (rd.sft / "config.json").write_text("{}")
    plan = plan_start(rd)
    [old] = _aside(tmp_path)
    assert (rd.sft / "config.json").read_text() == "{}" and (old / "sft" / "config.json").is_file()
    assert plan.message.endswith(f"its finished SFT stage is reused ({rd.sft})")
    assert not (rd.root / "metrics.jsonl").exists()
    unfinished = _run(tmp_path / "b")
    unfinished.sft.mkdir()  # no config.json: the stage never finished
    assert "SFT" not in plan_start(unfinished).message and not unfinished.sft.exists()
    fresh = _run(tmp_path / "c")
    fresh.sft.mkdir()
    (fresh.sft / "config.json").write_text("{}")
    plan_start(fresh, fresh=True)
    assert not fresh.sft.exists()  # --fresh starts over entirely


def test_a_finished_run_is_set_aside_not_resumed(tmp_path):
    rd = _run(tmp_path, 2, finished=True)
    plan = plan_start(rd)
    assert plan.checkpoint is None
    [old] = _aside(tmp_path)
    assert "held a finished run" in plan.message and f"--resume-from {old}" in plan.message


def test_resume_false_sets_an_earlier_run_aside(tmp_path):
    rd = _run(tmp_path, 2)
    plan = plan_start(rd, resume=False)
    assert plan.checkpoint is None and "checkpoint.resume = false" in plan.message and _aside(tmp_path)


def test_fresh_keeps_the_old_run_beside_the_new_one(tmp_path):
    rd = _run(tmp_path, 2)
    plan = plan_start(rd, fresh=True)
    [old] = _aside(tmp_path)
    assert plan.checkpoint is None and (old / "checkpoints" / "step_000002").is_dir()
    assert plan.message.startswith("--fresh: starting over") and str(old) in plan.message
    _run(tmp_path)  # a second --fresh in the same second gets its own name
    plan_start(rd, fresh=True)
    assert len(_aside(tmp_path)) == 2


def test_resume_from_an_older_checkpoint_of_this_run_deletes_the_later_ones(tmp_path):
    rd = _run(tmp_path, 2, 4, 6, finished=True)
    plan = plan_start(rd, resume_from=rd.checkpoint(4))
    assert plan.checkpoint == rd.checkpoint(4)
    assert not rd.checkpoint(6).exists() and rd.checkpoint(2).exists()
    assert not rd.summary.exists()  # the run is unfinished again: a rerun resumes it
    assert "step_000006" in plan.message


def test_resume_from_a_run_directory_takes_its_newest_checkpoint(tmp_path):
    rd = _run(tmp_path, 2, 4)
    assert plan_start(rd, resume_from=rd.root).checkpoint == rd.checkpoint(4)


def test_resume_from_another_runs_checkpoint_links_it_in(tmp_path):
    other = RunDir(tmp_path / "other")
    src = _checkpoint(other, 3)
    rd = _run(tmp_path)  # something already here: set aside
    plan = plan_start(rd, resume_from=src)
    assert plan.checkpoint == rd.checkpoint(3)
    assert (rd.checkpoint(3) / "learner" / "model.bin").read_text() == "v3" and src.is_dir()
    assert _aside(tmp_path) and "kept as" in plan.message


def test_resume_from_something_else_names_it_and_what_is_there(tmp_path):
    rd = _run(tmp_path, 2)
    with pytest.raises(ConfigError, match=r"--resume-from .*step_000009: not a checkpoint.*step_000002"):
        plan_start(rd, resume_from=rd.checkpoints / "step_000009")
    with pytest.raises(ConfigError, match="give one of them"):
        plan_start(rd, fresh=True, resume_from=rd.checkpoint(2))


def test_a_run_directory_holding_the_model_is_never_moved(tmp_path):
    rd = _run(tmp_path)
    with pytest.raises(ConfigError, match="model.path .* lies inside"):
        plan_start(rd, model_path=str(rd.root / "sft"))
    assert rd.root.is_dir() and not _aside(tmp_path)


class _StopAfterTheStartPlan(BaseException):
    """Raised where the run would prepare its model: the start plan has run by then. A
    BaseException, as KeyboardInterrupt is, so that it leaves ``agentrl train`` as itself: the CLI
    turns any ``Exception`` it did not expect into one ``agentrl: error:`` line."""


@pytest.mark.parametrize("flag", ["--fresh", "--resume-from"])
def test_the_train_command_takes_fresh_and_resume_from_to_the_start_plan(tmp_path, monkeypatch, flag):
    """Through the CLI: ``--fresh`` sets a resumable run aside and starts at step 0;
    ``--resume-from`` goes on from the checkpoint it names, not the newest."""
    from agentrl import cli
    from agentrl.engine import controller

    rd = _run(tmp_path, 2, 4)

    def stop(*_: object, **__: object) -> str:
        raise _StopAfterTheStartPlan

    monkeypatch.setattr(controller, "prepare_model", stop)
    recipe = tmp_path / "r.toml"
    recipe.write_text(f'name = "r"\nrun_dir = "{rd.root}"\n[model]\npath = "unused"\n')
    args = ["train", str(recipe), flag] + ([str(rd.checkpoint(2))] if flag == "--resume-from" else [])
    with pytest.raises(_StopAfterTheStartPlan):
        cli.main(args)
    events = (rd.root / "metrics.jsonl").read_text()
    if flag == "--fresh":
        [old] = _aside(tmp_path)
        assert (old / "checkpoints").is_dir() and not rd.checkpoint(4).exists()
        assert "--fresh: starting over at step 0" in events
    else:
        assert not _aside(tmp_path) and str(rd.checkpoint(2)) in events


def test_the_train_command_refuses_fresh_with_resume_from(tmp_path, capsys):
    from agentrl import cli

    with pytest.raises(SystemExit):
        cli.main(["train", str(tmp_path / "r.toml"), "--fresh", "--resume-from", str(tmp_path)])
    assert "not allowed with argument" in capsys.readouterr().err
