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
