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
