"""No third-party progress bars on agentrl's console (issue 36): transformers' "Writing model
shards" (a model built for a run, ``agentrl model init``, an export), Hugging Face Hub and
datasets bars. Each case runs in a fresh interpreter: these libraries read their switches when
they are imported, so one process's order of imports must not decide another test."""

from __future__ import annotations

import subprocess
import sys

from tests.e2e.helpers import REPO

BAR = "Writing model shards"

BUILD = """
import sys

def build(out):
    from agentrl.models.tiny import TinyModelSpec, build_tiny_model  # imports transformers: at the first build

    build_tiny_model(out, ["Compute 1+2. <code>1+2</code> \\\\boxed{3}"] * 20, TinyModelSpec(vocab_size=300, hidden_size=64,
                     num_layers=1, num_heads=1, num_kv_heads=1, intermediate_size=64, max_position_embeddings=256))
    sys.stderr.flush()
"""


def _run(code: str, cwd, *args: str) -> subprocess.CompletedProcess:
    done = subprocess.run([sys.executable, *args] if args else [sys.executable, "-c", code], cwd=cwd,
                          capture_output=True, text=True, timeout=300, env=_env())
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def _env() -> dict[str, str]:
    import os

    from agentrl.quiet import QUIET_ENV

    env = {k: v for k, v in os.environ.items() if k not in QUIET_ENV}  # as a user's shell has it
    env["PYTHONPATH"] = str(REPO)
    return env


def test_the_python_api_turns_the_bars_off_for_its_call_and_back_on_after(tmp_path):
    """Within no_progress_bars (what agentrl.train, agentrl.evaluate and agentrl.check(dry_run=True)
    run in) no bar, whether transformers is first imported within the call or was imported
    before it (as a user's script may have); after the call the bar is back."""
    code = BUILD + (
        "from agentrl.quiet import no_progress_bars\n"
        "assert 'transformers' not in sys.modules\n"
        "with no_progress_bars():\n"
        "    print('-- within, imported within', file=sys.stderr); build('a')\n"
        "print('-- after', file=sys.stderr); build('b')\n"
        "with no_progress_bars():\n"
        "    print('-- within, imported before', file=sys.stderr); build('c')\n"
        "print('-- after', file=sys.stderr); build('d')\n"
    )
    err = _run(code, tmp_path).stderr
    parts = err.split("-- ")[1:]
    assert [p.split("\n")[0] for p in parts] == ["within, imported within", "after", "within, imported before", "after"], err
    assert [BAR in p for p in parts] == [False, True, False, True], err  # after: the bar is there to be silenced
    assert not any("it/s" in p for p in parts[::2]), err


def test_the_agentrl_command_prints_no_third_party_bar(tmp_path):
    """``agentrl model init`` builds the model as ``agentrl train`` does for a recipe's
    ``model.build`` (agentrl.engine.prepare): the same save_pretrained, no bar on the console."""
    done = _run("", tmp_path, "-m", "agentrl.cli", "model", "init", "tiny", str(tmp_path / "m"), "--rows", "50")
    assert done.stdout.strip() == f"tiny model written to {tmp_path / 'm'}"
    assert BAR not in done.stderr and "it/s" not in done.stderr, done.stderr


def test_the_command_sets_only_what_the_user_left_unset_and_takes_it_back(monkeypatch):
    import os

    import agentrl.cli as cli
    from agentrl.quiet import QUIET_ENV

    for name in QUIET_ENV:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("TQDM_DISABLE", "0")  # the user's own choice
    seen = {}
    monkeypatch.setattr(cli, "_command", lambda args, hooks: seen.update({k: os.environ.get(k) for k in QUIET_ENV}) or 0)
    assert cli.main(["report", "nowhere"]) == 0
    assert seen == {"HF_HUB_DISABLE_PROGRESS_BARS": "1", "HF_DATASETS_DISABLE_PROGRESS_BARS": "1", "TQDM_DISABLE": "0"}
    assert {k: os.environ.get(k) for k in QUIET_ENV} == {"HF_HUB_DISABLE_PROGRESS_BARS": None, "HF_DATASETS_DISABLE_PROGRESS_BARS": None, "TQDM_DISABLE": "0"}
