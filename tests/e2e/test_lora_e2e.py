"""`agentrl train` with `[lora]` for real: adapter-only versions reach the generator, checkpoints
resume, `agentrl export` writes the adapter and (with --merge) a merged model.

The first invocation is stopped with Ctrl-C: it exits with 130 and says so, and no process it
started is left behind (:func:`tests.e2e.helpers.run_then_ctrl_c`); the same command then resumes
from its checkpoint. (One run covers both, formerly this test and test_interrupt_e2e.py's: one
start-up.)"""

import json
import os
import subprocess
import sys

import pytest

from tests.e2e.helpers import REPO, placements, run_then_ctrl_c, steps, train_cmd

LORA_RUN = (
    # the task of test_learning_e2e: an answer starting with a digit earns 1, so even the
    # untrained tiny model gets a learning signal (non-zero advantages: the adapter moves)
    "env.id='tests.e2e.direction_env:DigitFirstEnv'",
    "env.kwargs={}",
    "lora.rank=8",
    "lora.alpha=32.0",
    "learner.lr=2e-2",
    "learner.batch_size=32",
    "rollout.group_size=8",
    "rollout.max_new_tokens=2",
    "data.limit=256",
    "sft.steps=0",
    "eval.limit=0",
    "checkpoint.every_steps=2",
)


@pytest.mark.e2e
@pytest.mark.vllm
def test_lora_run_publishes_adapters_stops_on_ctrl_c_leaving_no_process_resumes_and_exports(tmp_path, tiny_calc_model):
    run_dir = tmp_path / "run"
    env = {**os.environ, "RAY_DEDUP_LOGS": "0", "PYTHONPATH": str(REPO)}

    cmd = train_cmd(run_dir, tiny_calc_model, "learner.max_steps=6", *LORA_RUN)

    # Ctrl-C once checkpoint step 2 is written: a clean stop, nothing left running
    run_then_ctrl_c(cmd, run_dir, tmp_path / "first.log", env, min_step=2)
    interrupted_at = max(steps(run_dir))
    assert 2 <= interrupted_at < 6, interrupted_at

    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=900, env=env)  # resumes
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert "resuming from" in " ".join(r["message"] for r in records if r["kind"] == "event")
    steps_logged = [r for r in records if r["kind"] == "step"]
    assert [s["version"] for s in steps_logged] == [1, 2, 3, 4, 5, 6]
    # tokens of published adapter versions reached the learner
    assert max(s["max_token_version"] for s in steps_logged) >= 1
    learner_info = next(r for r in records if r["kind"] == "event" and r["message"].startswith("learner ready"))["learners"][0]
    assert 0 < learner_info["trainable_parameters"] < learner_info["parameters"] / 5
    # every version is an adapter folder, small beside the model
    versions = list(run_dir.joinpath("weights").iterdir())
    assert versions
    for v in versions:
        assert (v / "adapter_config.json").is_file() and not (v / "model.safetensors").exists()
        assert (v / "adapter_model.safetensors").stat().st_size < (tiny_calc_model / "model.safetensors").stat().st_size / 3
    assert (run_dir / "final" / "model.safetensors").is_file() and (run_dir / "final_adapter" / "adapter_config.json").is_file()
    assert placements(run_dir) and set(placements(run_dir)) == {"colocated"}  # LoRA in the mode "auto" picks on a CPU
    trained = [json.loads(line) for line in (run_dir / "trained.jsonl").read_text().splitlines()]
    prompts = [p for t in trained for p in t["prompts"]]
    assert len(prompts) == len(set(prompts))

    ckpt = run_dir / "checkpoints" / "step_000004"
    for extra, out in (([], tmp_path / "adapter"), (["--merge"], tmp_path / "merged")):
        proc = subprocess.run([sys.executable, "-m", "agentrl.cli", "export", str(ckpt), str(out), *extra], cwd=REPO, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]

    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    ids = torch.tensor([[5, 9, 12, 7, 30, 31, 8, 40, 41, 42, 43, 44]])
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "merged", torch_dtype=torch.float32)
    base = AutoModelForCausalLM.from_pretrained(tiny_calc_model, torch_dtype=torch.float32)
    plain = base(input_ids=ids).logits
    adapted = PeftModel.from_pretrained(base, str(tmp_path / "adapter"))(input_ids=ids).logits
    assert torch.allclose(merged(input_ids=ids).logits, adapted, atol=1e-4)
    assert not torch.allclose(adapted, plain, atol=1e-4)  # the adapter was trained
