"""The tutorial's own-model commands as written (docs/tutorial.md §6, issue 36), with a local
Hugging Face cache standing in for the hub: the tiny model stored under the hub id the tutorial
names, read offline (``HF_HUB_OFFLINE=1``), so the command's hub id goes through the same loading
code as on a machine with the hub (transformers, vLLM and the tokenizer all resolve it from the
cache).

- The CPU command (`--set model.path=Qwen/... --set model.build=null`) is run for real, with
  overrides appended only to make the run short: it trains from the hub model and nothing is
  built into a folder named after the hub id.
- The GPU command cannot run on a machine without GPUs; its dry run resolves the same model and
  says the placement is planned for elsewhere.
- The own-folder command (a local folder in place of ``path/to/my-model``): its dry run loads the
  folder's tokenizer and plans no build."""

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e.helpers import REPO

HUB_ID = "Qwen/Qwen2.5-0.5B-Instruct"
SHORT = ["--set", "sft.steps=0", "--set", "eval.limit=0", "--set", "learner.max_steps=1", "--set", "learner.batch_size=8",
         "--set", "rollout.max_new_tokens=8", "--set", "data.limit=16", "--set", "learner.max_degenerate_steps=0"]
"""Appended to the tutorial's command: one short RL step, no warm-up, no evaluation."""


def tutorial_commands() -> list[list[str]]:
    """The bash blocks of the tutorial's §6 (hub model / own model), each as argv."""
    text = (REPO / "docs" / "tutorial.md").read_text()
    section = text.split("\n## 6. ", 1)[1].split("\n## 7. ", 1)[0]
    return [shlex.split(block.replace("\\\n", " ")) for block in re.findall(r"```bash\n(.*?)```", section, re.DOTALL)]


def hub_cache(root: Path, repo_id: str, model: Path) -> Path:
    """A Hugging Face hub cache (``HF_HUB_CACHE``) holding ``model``'s files as ``repo_id``'s
    main revision, as a download would have left them."""
    entry = root / f"models--{repo_id.replace('/', '--')}"
    revision = "0" * 40
    (entry / "refs").mkdir(parents=True)
    (entry / "refs" / "main").write_text(revision)
    shutil.copytree(model, entry / "snapshots" / revision)
    return root


def _agentrl(argv: list[str], env: dict[str, str], timeout: float = 900) -> subprocess.CompletedProcess:
    assert argv[0] == "agentrl", argv
    return subprocess.run([sys.executable, "-m", "agentrl.cli", *argv[1:]], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=timeout)


@pytest.mark.vllm
def test_the_tutorials_own_model_commands_run_as_written(tmp_path, tiny_calc_model):
    cpu, gpu, folder = tutorial_commands()
    assert cpu == ["agentrl", "train", "recipes/tiny_calc.toml", "--set", f"model.path={HUB_ID}", "--set", "model.build=null"], cpu
    assert gpu[:6] == cpu[:6] and "generator.num_gpus=1" in gpu, gpu
    assert folder[:4] == cpu[:4] and "model.path=path/to/my-model" in folder, folder
    environ = {k: v for k, v in os.environ.items() if k not in ("HF_HOME", "HF_HUB_CACHE", "HF_ENDPOINT")}
    env = {**environ, "HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(hub_cache(tmp_path / "hub", HUB_ID, tiny_calc_model)),
           "RAY_DEDUP_LOGS": "0"}
    assert not (REPO / HUB_ID.split("/")[0]).exists()

    # the GPU command: the same model resolved, the GPUs planned for another machine
    dry = _agentrl([gpu[0], "check", *gpu[2:], "--dry-run"], env, timeout=300)
    assert dry.returncode == 0, dry.stdout + dry.stderr
    [model_line] = [line for line in dry.stdout.splitlines() if line.split()[1:2] == ["model"]]
    assert model_line.split()[0] == "ok" and HUB_ID in model_line and "tokenizer loads" in model_line, dry.stdout
    assert re.search(r"^elsewhere +placement +this machine has no GPU", dry.stdout, re.MULTILINE), dry.stdout

    # the own-folder command, with a real folder: used as it is
    mine = [arg.replace("path/to/my-model", str(tiny_calc_model)) for arg in folder]
    dry = _agentrl([mine[0], "check", *mine[2:], "--dry-run"], env, timeout=300)
    assert dry.returncode == 0, dry.stdout + dry.stderr
    [model_line] = [line for line in dry.stdout.splitlines() if line.split()[1:2] == ["model"]]
    assert model_line.split()[0] == "ok" and "tokenizer loads" in model_line and "built" not in model_line, dry.stdout

    # the CPU command, for real (made short)
    run_dir = tmp_path / "run"
    done = _agentrl([*cpu, *SHORT, "--set", f"run_dir='{run_dir}'"], env)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-5000:]
    assert not (REPO / HUB_ID.split("/")[0]).exists(), "a folder named after the hub id was made"
    assert json.loads((run_dir / "recipe.json").read_text())["model"]["path"] == HUB_ID
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    events = [r["message"] for r in records if r["kind"] == "event"]
    assert not any("built" in m or "building" in m.lower() for m in events), events
    assert any(m.startswith("run tiny_calc:") and f"model={HUB_ID}" in m for m in events), events
    assert [r["step"] for r in records if r["kind"] == "step"] == [1]
    final = run_dir / "final"
    assert (final / "config.json").is_file()
    # the run trained the hub model: the final weights have the cached model's shapes
    from safetensors import safe_open

    def shapes(path: Path) -> dict[str, tuple]:
        out = {}
        for f in sorted(path.glob("*.safetensors")):
            with safe_open(str(f), "pt") as st:
                out.update({k: tuple(st.get_slice(k).get_shape()) for k in st.keys()})
        return out

    assert shapes(final) == shapes(tiny_calc_model)
