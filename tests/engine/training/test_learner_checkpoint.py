"""Checkpoint -> resume gives the same run as no interruption; any checkpoint exports to HF."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from agentrl.engine.training.checkpoint import export_checkpoint, read_trainer_state
from agentrl.errors import LearnerError
from tests.engine.training.test_learner_correctness import make_learner, make_samples, max_diff, params

SCHEDULE = dict(lr=5e-3, adam_eps=1e-8, grad_clip=1.0, warmup_steps=1, lr_schedule="cosine", total_steps=6)


def _resumed(model, ckpt, batches) -> tuple[dict, dict, dict, dict]:
    """A fresh learner loads ``ckpt`` and trains ``batches``: the trainer state it loaded, its
    parameters right after the load, the last step's metrics and the final parameters."""
    learner = make_learner(str(model), **SCHEDULE)
    try:
        state = learner.load_checkpoint(str(ckpt))
        assert learner.step == state["step"] and learner.updates == state["step"]
        loaded = params(learner)
        for b in batches:
            last = learner.train_step(b)
        return state, loaded, last, params(learner)
    finally:
        learner.shutdown()


def test_resume_matches_uninterrupted_run(tiny_calc_model, tmp_path):
    batches = [make_samples(5, seed=100 + k) for k in range(6)]
    ckpt = tmp_path / "ckpt-3"

    a = make_learner(str(tiny_calc_model), **SCHEDULE)
    try:
        for b in batches[:3]:
            a.train_step(b)
        a.save_checkpoint(str(ckpt))
        at_save = params(a)
        torch.rand(7)  # the RNG moves on after the save; resume must restore the saved state
        for b in batches[3:]:
            last_a = a.train_step(b)
        final_a = params(a)
    finally:
        a.shutdown()

    state, loaded, last_b, final_b = _resumed(tiny_calc_model, ckpt, batches[3:])
    assert state["step"] == 3
    assert max_diff(loaded, at_save) == 0.0

    assert last_a["lr"] == pytest.approx(last_b["lr"]) and last_a["step"] == last_b["step"] == 6
    assert last_a["loss"] == pytest.approx(last_b["loss"], abs=1e-7)
    assert max_diff(final_a, final_b) < 1e-7
    assert max_diff(final_a, at_save) > 1e-4  # the three steps after the save changed the weights

    # the checkpoint exports to a Hugging Face folder holding the weights at the save
    out = export_checkpoint(ckpt, tmp_path / "export")
    exported = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).state_dict()
    assert max_diff({k: exported[k] for k in at_save}, at_save) == 0.0
    assert (out / "tokenizer_config.json").is_file()
    assert not any(p.name.startswith(".") for p in tmp_path.iterdir())  # no temporaries left


def test_a_background_checkpoint_holds_the_state_at_the_save_while_training_goes_on(tiny_calc_model, tmp_path, monkeypatch):
    """checkpoint.background: save_checkpoint returns with the state copied; the next steps train
    while a thread writes it; the folder appears at finish_checkpoint and holds the weights and
    AdamW state of the save (a resume from it trains as the uninterrupted run did), not the
    weights trained meanwhile. The disk is made slow on purpose: the write waits until the later
    steps have changed the weights (a tiny model's write would otherwise end before they start)."""
    import threading
    import time

    import torch.distributed.checkpoint as dcp

    trained_on = threading.Event()
    write_data = dcp.FileSystemWriter.write_data

    def slow_write(self, plan, planner):
        assert trained_on.wait(60), "the steps after the save never ended"
        return write_data(self, plan, planner)

    monkeypatch.setattr(dcp.FileSystemWriter, "write_data", slow_write)
    batches = [make_samples(5, seed=200 + k) for k in range(5)]
    ckpt = tmp_path / "ckpt-2"
    a = make_learner(str(tiny_calc_model), **SCHEDULE)
    try:
        for b in batches[:2]:
            a.train_step(b)
        assert a.save_checkpoint(str(ckpt), background=True) == str(ckpt)
        at_save = params(a)
        for b in batches[2:]:  # the weights move on while the checkpoint is written
            last_a = a.train_step(b)
        final_a = params(a)
        assert not ckpt.exists()  # not in place before finish: a crash now leaves the previous one the newest
        trained_on.set()
        deadline = time.monotonic() + 60
        while not ckpt.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert ckpt.exists()  # in place as soon as the write ended, before anyone called finish_checkpoint
        done = a.finish_checkpoint()
        assert done is not None and done["path"] == str(ckpt) and done["wait_s"] >= 0.0
        assert a.finish_checkpoint() is None  # nothing pending any more
    finally:
        a.shutdown()
    assert max_diff(final_a, at_save) > 1e-4

    state, loaded, last_b, final_b = _resumed(tiny_calc_model, ckpt, batches[2:])
    assert state["step"] == 2
    assert max_diff(loaded, at_save) == 0.0
    assert max_diff(final_b, final_a) < 1e-7  # AdamW's moments of step 2 were saved too
    assert last_a["loss"] == pytest.approx(last_b["loss"], abs=1e-7)
    assert not any(p.name.startswith(".") for p in tmp_path.iterdir())  # no temporaries left


def test_checkpoint_before_the_first_update_and_errors(tiny_calc_model, tmp_path):
    learner = make_learner(str(tiny_calc_model))
    try:
        learner.save_checkpoint(str(tmp_path / "c0"))
        assert read_trainer_state(tmp_path / "c0")["has_optimizer_state"] is False
        assert learner.load_checkpoint(str(tmp_path / "c0"))["step"] == 0
        assert not learner.optimizer.state  # AdamW state was not initialised by the save
        with pytest.raises(LearnerError, match="not an agentrl checkpoint"):
            learner.load_checkpoint(str(tmp_path / "missing"))
    finally:
        learner.shutdown()
    with pytest.raises(LearnerError, match="not an agentrl checkpoint"):
        export_checkpoint(tmp_path / "missing", tmp_path / "out")


def test_cli_export(tiny_calc_model, tmp_path, capsys):
    from agentrl.cli import main

    learner = make_learner(str(tiny_calc_model))
    try:
        learner.train_step(make_samples(3, seed=7))
        learner.save_checkpoint(str(tmp_path / "run" / "checkpoints" / "step_1" / "learner"))
        want = params(learner)
    finally:
        learner.shutdown()
    assert main(["export", str(tmp_path / "run" / "checkpoints" / "step_1"), str(tmp_path / "hf")]) == 0
    got = AutoModelForCausalLM.from_pretrained(tmp_path / "hf", dtype=torch.float32).state_dict()
    assert max_diff({k: got[k] for k in want}, want) == 0.0
    assert main(["export", str(tmp_path / "nothing"), str(tmp_path / "hf2")]) == 2
    assert "not an agentrl checkpoint" in capsys.readouterr().err


def test_generation_config_travels_with_every_written_model(tiny_calc_model, tmp_path):
    """Instruct models keep their end-of-turn EOS ids in generation_config.json, not config.json
    (Qwen2.5-Instruct: config eos <|endoftext|>, generation eos [<|im_end|>, <|endoftext|>]). A
    published version, a checkpoint's export and the SFT/final folders must keep it, or vLLM
    serving them never stops at the end of a turn."""
    import json
    import shutil

    from transformers import GenerationConfig

    model = tmp_path / "instruct-like"
    shutil.copytree(tiny_calc_model, model)
    config = json.loads((model / "config.json").read_text())
    eos = [config["eos_token_id"], 3] if isinstance(config["eos_token_id"], int) else [*config["eos_token_id"], 3]
    GenerationConfig(eos_token_id=eos, pad_token_id=config.get("pad_token_id"), temperature=0.7, do_sample=True).save_pretrained(model)

    learner = make_learner(str(model))
    try:
        published = learner.publish(str(tmp_path / "v1"), with_tokenizer=True)
        learner.save_checkpoint(str(tmp_path / "ckpt"))
    finally:
        learner.shutdown()
    exported = export_checkpoint(tmp_path / "ckpt", tmp_path / "export")
    for folder in (published, exported):
        gen = GenerationConfig.from_pretrained(folder)
        assert gen.eos_token_id == eos and gen.temperature == 0.7, folder


def test_exported_models_carry_inference_settings_and_the_training_dtype(tiny_calc_model, tmp_path):
    """The learner trains with ``use_cache`` off and float32 master weights; what leaves the run
    (the final folder, a checkpoint's export) is for inference: cache on, the recipe's dtype."""
    import json

    from safetensors import safe_open

    learner = make_learner(str(tiny_calc_model), dtype="bfloat16")
    try:
        learner.train_step(make_samples(2, seed=3))
        final = learner.publish(str(tmp_path / "final"), with_tokenizer=True, serving_dtype=True)
        learner.save_checkpoint(str(tmp_path / "ckpt"))
    finally:
        learner.shutdown()
    exported = export_checkpoint(tmp_path / "ckpt", tmp_path / "export")
    for folder in (final, exported):
        config = json.loads((tmp_path / folder / "config.json").read_text())
        assert config["use_cache"] is True and config["dtype"] == "bfloat16", (folder, config)
        with safe_open(str(tmp_path / folder / "model.safetensors"), "pt") as f:
            assert {f.get_slice(k).get_dtype() for k in f.keys()} == {"BF16"}, folder
        assert AutoModelForCausalLM.from_pretrained(folder).dtype == torch.bfloat16
