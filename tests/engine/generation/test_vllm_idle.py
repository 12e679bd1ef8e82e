"""vLLM's ring-buffer readers stop spinning after their last read when a colocated run asks
(the learner gets the cores at once); unset, vLLM's own default stands."""

import zmq

from agentrl.engine.generation import vllm_idle


def reader(monkeypatch, value):
    from vllm.distributed.device_communicators import shm_broadcast

    monkeypatch.setattr(shm_broadcast.SpinCondition, "__init__", shm_broadcast.SpinCondition.__init__)  # restored after the test
    if value is None:
        monkeypatch.delenv(vllm_idle.SPIN_ENV, raising=False)
    else:
        monkeypatch.setenv(vllm_idle.SPIN_ENV, value)
    applied = vllm_idle.apply_spin_setting()
    ctx = zmq.Context()
    try:
        cond = shm_broadcast.SpinCondition(True, ctx, "inproc://agentrl-spin-test")
        return applied, cond.busy_loop_s
    finally:
        ctx.destroy(linger=0)


def test_spin_time_is_set_from_the_environment(monkeypatch):
    assert reader(monkeypatch, "0") == (0.0, 0.0)


def test_unset_keeps_vllms_default(monkeypatch):
    applied, busy = reader(monkeypatch, None)
    assert applied is None and busy == 1


def test_colocated_cpu_generators_get_the_setting_and_separate_ones_do_not(tmp_path):
    from agentrl.config import load_recipe
    from agentrl.engine import wiring

    p = tmp_path / "r.toml"
    p.write_text('[model]\npath = "m"\n')
    for mode, expected in (("colocated", "0"), ("separate", None)):
        r = load_recipe(p, [f'placement.mode="{mode}"'])
        settings = wiring.engine_settings(r, model="m", tokenizer=None)
        env = wiring.generator_actor(r, settings, 0, 0, tmp_path).options["runtime_env"]["env_vars"]
        assert env.get(vllm_idle.SPIN_ENV) == expected
