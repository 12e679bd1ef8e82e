import pytest

from pathlib import Path

from agentrl.cli import main

REPO = Path(__file__).resolve().parents[1]


def test_check_ok(capsys):
    assert main(["check", str(REPO / "recipes" / "tiny_calc.toml")]) == 0
    assert "ok" in capsys.readouterr().out


def test_check_bad_override_is_clear_error(capsys):
    assert main(["check", str(REPO / "recipes" / "tiny_calc.toml"), "--set", "learner.lr=abc"]) == 2
    err = capsys.readouterr().err
    assert "learner.lr" in err and "Traceback" not in err


def test_model_init_tiny(tmp_path, capsys):
    out = tmp_path / "m"
    assert main(["model", "init", "tiny", str(out), "--rows", "200"]) == 0
    assert (out / "config.json").exists() and (out / "tokenizer.json").exists()
    # a second init without --overwrite refuses to clobber the folder
    assert main(["model", "init", "tiny", str(out), "--rows", "200"]) == 2


def test_sigterm_stops_like_ctrl_c():
    """SIGTERM cancels the running controller coroutine (its clean-up runs), then KeyboardInterrupt."""
    import asyncio
    import os
    import signal

    import pytest

    from agentrl.cli import _stop_on_signals

    saved = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    cleaned = []

    async def run() -> None:
        try:
            asyncio.get_running_loop().call_later(0.2, os.kill, os.getpid(), signal.SIGTERM)
            await asyncio.sleep(30)
        finally:
            await asyncio.sleep(0)  # clean-up may still await
            cleaned.append(True)

    try:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # as for a background job of a script
        _stop_on_signals()
        with pytest.raises(KeyboardInterrupt):
            asyncio.run(run())
    finally:
        signal.signal(signal.SIGINT, saved[0])
        signal.signal(signal.SIGTERM, saved[1])
    assert cleaned == [True]


def test_version_names_the_installed_distribution(capsys):
    from importlib.metadata import version

    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0
    assert capsys.readouterr().out.strip() == f"agentrl {version('agentrl')}"


def test_an_unexpected_error_in_a_run_is_one_line_in_words_and_its_traceback_a_file(tmp_path, monkeypatch, capsys):
    """A failure agentrl did not expect (here: user code's ImportError raised out of the run, as a
    Ray task error would carry it) exits 2 with one ``agentrl: error:`` line, never a traceback on
    the console; the traceback is kept in the run's logs/traceback.txt."""
    from agentrl.engine import controller

    def broken_run(self):
        raise ImportError("cannot import name 'GenerateFn' from 'agentrl.engine.common.interfaces'")

    monkeypatch.setattr(controller.Controller, "run", broken_run)
    run_dir = tmp_path / "run"
    status = main(["train", str(REPO / "recipes/tiny_calc.toml"), "--set", f"run_dir={str(run_dir)!r}"])
    err = capsys.readouterr().err
    assert status == 2
    assert "Traceback" not in err
    assert "agentrl: error: the run stopped on an unexpected error: ImportError: cannot import name 'GenerateFn'" in err
    saved = (run_dir / "logs" / "traceback.txt").read_text()
    assert "Traceback (most recent call last)" in saved and "broken_run" in saved


def test_error_in_words_takes_the_remote_tracebacks_last_line():
    from agentrl.errors import exception_in_words as error_in_words

    remote = RuntimeError("ray::RolloutWorker.process_id()\n  File \"x.py\", line 3, in <module>\n    import y\nImportError: no module y\n")
    assert error_in_words(remote) == "ImportError: no module y"
    assert error_in_words(ValueError("bad value")) == "ValueError: bad value"
    assert error_in_words(KeyError()) == "KeyError"
