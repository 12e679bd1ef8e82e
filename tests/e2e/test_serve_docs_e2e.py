"""docs/tutorial.md, "Serve the trained model", run as written (issue 36): ``agentrl export`` of a
run's checkpoint, vLLM's OpenAI server on the run's ``final/`` (``vllm serve`` is
``python -m vllm.entrypoints.openai.api_server`` in the CPU build), and the docs' OpenAI client
call against it. The run directory is made by a real learner (one training step of the tiny
model: ``final/`` published as the controller publishes it, and a checkpoint after the step);
the docs' paths and port are swapped for the test's own."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys

import pytest
from safetensors.torch import load_file

from tests.e2e.helpers import REPO, vllm_server
from tests.engine.training.test_learner_correctness import make_learner, make_samples

pytestmark = [pytest.mark.vllm, pytest.mark.e2e]

DOC = REPO / "docs" / "tutorial.md"


def _example(name: str, lang: str) -> str:
    match = re.search(rf"<!-- example: {name} -->\s*```{lang}\n(.*?)```", DOC.read_text(), re.DOTALL)
    assert match is not None, f"no example {name!r} in {DOC}"
    return match.group(1)


@pytest.fixture
def trained_run(tmp_path, tiny_calc_model):
    """RUN_DIR after one learner step: final/ (tokenizer, serving dtype, merged: as the
    controller writes it) and checkpoints/step_000001/learner."""
    run = tmp_path / "runs" / "tiny_calc"
    learner = make_learner(str(tiny_calc_model))
    try:
        learner.train_step(make_samples(4, seed=1))
        learner.publish(str(run / "final"), with_tokenizer=True, serving_dtype=True, merged=True)
        learner.save_checkpoint(str(run / "checkpoints" / "step_000001" / "learner"))
    finally:
        learner.shutdown()
    return run


def test_export_then_serve_as_the_tutorial_says(tmp_path, trained_run) -> None:
    commands = [line.split("#")[0].strip() for line in _example("serve", "bash").splitlines() if line.strip()]
    export, serve = (shlex.split(c.replace("runs/tiny_calc", str(trained_run)).replace("step_000040", "step_000001")) for c in commands)

    assert export[:2] == ["agentrl", "export"]
    done = subprocess.run([sys.executable, "-m", "agentrl.cli", *export[1:]], cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    exported = trained_run / "step40"
    assert done.stdout.strip() == f"exported to {exported}"
    final_weights, exported_weights = load_file(trained_run / "final" / "model.safetensors"), load_file(exported / "model.safetensors")
    assert final_weights.keys() == exported_weights.keys()
    assert all(final_weights[k].equal(exported_weights[k]) for k in final_weights)  # the checkpoint after the same step
    assert {p.name for p in (trained_run / "final").iterdir()} == {p.name for p in exported.iterdir()}

    assert serve[:2] == ["vllm", "serve"]
    model, flags = serve[2], serve[3:]
    port = flags.index("--port")
    del flags[port:port + 2]  # the helper's free port instead of 8000
    with vllm_server(model, tmp_path / "server.log", *flags) as base:
        client = _example("serve-client", "python").replace("http://localhost:8000", base)
        namespace: dict = {}
        exec(compile(client, "serve-client", "exec"), namespace)
    reply = namespace["reply"]
    choice = reply.choices[0]
    assert reply.model == "tiny-calc" and isinstance(choice.message.content, str)
    assert choice.finish_reason in ("stop", "length")
    assert "<|im_start|>" not in choice.message.content and "</code>" not in choice.message.content  # stopped there, not past it
