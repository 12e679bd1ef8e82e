"""Rollout with a scripted generator at the seam: token-in/token-out fidelity turn by turn."""

import shutil

import anyio
import pytest

from agentrl.engine.common.interfaces import Generation
from agentrl.engine.episodes.render import IncrementalRenderer, TemplateMismatch
from agentrl.engine.episodes.env_episode import play_episode
from agentrl.envs.calc import CalcEnv
from agentrl.errors import GeneratorError
from agentrl.models.loading import load_tokenizer
from agentrl.sandbox.testing import FakeSandbox

ROW = {"question": "Compute 12*34+5.", "answer": "413"}

# A Qwen2.5-style template: default system prompt, tool results folded into a user turn.
QWEN25_STYLE = (
    "{%- if messages[0]['role'] != 'system' %}{{- '<|im_start|>system\\nYou are helpful.<|im_end|>\\n' }}{%- endif %}"
    "{%- for m in messages %}"
    "{%- if m['role'] == 'tool' %}{{- '<|im_start|>user\\n<tool_response>\\n' + m['content'] + '\\n</tool_response><|im_end|>\\n' }}"
    "{%- else %}{{- '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}{%- endif %}"
    "{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
# A Llama-3-style template (header ids, eot marker, tool role as ipython).
LLAMA3_STYLE = (
    "{{- '<|im_start|>' }}{%- for m in messages %}"
    "{{- '[' + ('ipython' if m['role'] == 'tool' else m['role']) + ']\\n\\n' + m['content'] + '<|im_end|>' }}"
    "{%- endfor %}{%- if add_generation_prompt %}{{- '[assistant]\\n\\n' }}{%- endif %}"
)
# A Qwen3-style template that drops earlier reasoning: not append-only.
DROPS_THINKING = (
    "{%- for m in messages %}{%- set c = m['content'] %}"
    "{%- if m['role'] == 'assistant' and not loop.last %}{%- set c = c.split('</think>')[-1] %}{%- endif %}"
    "{{- '<|im_start|>' + m['role'] + '\\n' + c + '<|im_end|>\\n' }}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


class ScriptedGenerator:
    """Answers each call with the next scripted text; records every prompt it saw."""

    def __init__(self, tok, turns, version=0):
        self.tok = tok
        self.turns = list(turns)
        self.prompts: list[list[int]] = []
        self.outputs: list[list[int]] = []
        self.version = version

    async def __call__(self, ids, params):
        self.prompts.append(list(ids))
        text = self.turns.pop(0)
        out = self.tok.encode(text, add_special_tokens=False)
        if text.endswith("<|im_end|>"):
            assert out[-1] == self.tok.eos_token_id
        self.outputs.append(out)
        return Generation(out, [-0.5] * len(out), [self.version] * len(out), "stop")


@pytest.fixture
def tok_with_template(tiny_calc_model, tmp_path):
    def make(template: str | None):
        if template is None:
            return load_tokenizer(str(tiny_calc_model))
        folder = tmp_path / f"tok{abs(hash(template))}"
        shutil.copytree(tiny_calc_model, folder)
        (folder / "chat_template.jinja").write_text(template)
        return load_tokenizer(str(folder))

    return make


def run_episode(tok, gen, **kw):
    env = CalcEnv(sandbox=FakeSandbox(), max_turns=3)
    args = dict(row=ROW, group_id="g", prompt_index=0, sample_index=0, seed=0, sampling={}, max_new_tokens=64, max_episode_tokens=1024)
    args.update(kw)
    return anyio.run(lambda: play_episode(env, tok, gen, **args))


@pytest.mark.parametrize("template", [None, QWEN25_STYLE, LLAMA3_STYLE], ids=["tiny", "qwen2.5-style", "llama3-style"])
def test_trained_tokens_equal_what_generator_saw(tok_with_template, template):
    tok = tok_with_template(template)
    gen = ScriptedGenerator(tok, ["<code>print(12*34+5)</code>", "It is \\boxed{413}<|im_end|>"])
    t = run_episode(tok, gen)
    assert t.status == "ok" and t.reward == 1.0
    # turn by turn: every prompt the generator saw is a prefix of the trajectory, followed by
    # exactly the ids it returned (loss mask 1), never re-tokenised
    for prompt, out in zip(gen.prompts, gen.outputs):
        n = len(prompt)
        assert t.tokens[:n] == prompt
        assert t.tokens[n : n + len(out)] == out
        assert t.loss_mask[n : n + len(out)] == [1] * len(out)
        assert all(v == 0 for v in t.versions[n : n + len(out)])
    assert sum(t.loss_mask) == sum(len(o) for o in gen.outputs)
    assert t.tokens == gen.prompts[-1] + gen.outputs[-1]
    # the interpreter output is in the trajectory, masked
    text = tok.decode(t.tokens)
    assert "413" in text.split("print(12*34+5)</code>")[1]
    assert t.metrics["tool_calls"] == 1 and t.metrics["turns"] == 2


def test_non_append_only_template_is_detected(tok_with_template):
    tok = tok_with_template(DROPS_THINKING)
    gen = ScriptedGenerator(tok, ["<think>hmm</think><code>print(1)</code>", "\\boxed{413}<|im_end|>"])
    t = run_episode(tok, gen)
    assert t.status == "truncated" and "not append-only" in t.info["error"]
    assert t.tokens == gen.prompts[0] + gen.outputs[0]  # nothing the generator did not see


def test_renderer_raises_on_mismatch(tok_with_template):
    tok = tok_with_template(DROPS_THINKING)
    r = IncrementalRenderer(tok, [{"role": "user", "content": "q"}])
    with pytest.raises(TemplateMismatch):
        r.append_turn("<think>x</think>y", [{"role": "tool", "content": "z"}])


def test_overflow_ends_episode(tok_with_template):
    tok = tok_with_template(None)
    gen = ScriptedGenerator(tok, ["<code>print(1)</code>"] * 3)
    prompt_len = len(IncrementalRenderer(tok, CalcEnv(sandbox=FakeSandbox()).initial_messages(ROW)).prompt_ids())
    t = run_episode(tok, gen, max_episode_tokens=prompt_len + 12)
    assert t.status == "overflow"
    assert len(t.tokens) <= prompt_len + 12


def test_generator_failure_is_infra_failure(tok_with_template):
    tok = tok_with_template(None)

    async def broken(ids, params):
        raise GeneratorError("engine died")

    t = run_episode(tok, broken)
    assert t.status == "infra_failure" and not t.trainable and "engine died" in t.info["error"]


def test_sandbox_failure_is_infra_failure(tok_with_template):
    from agentrl.errors import SandboxError

    tok = tok_with_template(None)
    gen = ScriptedGenerator(tok, ["<code>print(1)</code>"])
    env = CalcEnv(sandbox=FakeSandbox(error=SandboxError("bwrap gone")), max_turns=3)
    t = anyio.run(
        lambda: play_episode(env, tok, gen, row=ROW, group_id="g", prompt_index=0, sample_index=0, seed=0,
                             sampling={}, max_new_tokens=64, max_episode_tokens=1024)
    )
    assert t.status == "infra_failure" and not t.trainable


def test_routing_least_outstanding_tokens_with_group_affinity(tiny_calc_model):
    """Two slow fake generators: concurrent groups spread over both, each group stays on one."""
    from agentrl.engine.episodes.rollout import RolloutWorker
    from agentrl.engine.episodes.runner import EpisodeSettings

    tok = load_tokenizer(str(tiny_calc_model))

    class SlowGen:
        def __init__(self, name):
            self.name, self.calls = name, []

        async def generate(self, ids, params):
            self.calls.append(params["seed"])
            await anyio.sleep(0.05)
            out = tok.encode("\\boxed{413}<|im_end|>", add_special_tokens=False)
            return Generation(out, [-0.1] * len(out), [0] * len(out), "stop")

    gens = [SlowGen("a"), SlowGen("b")]
    worker = RolloutWorker(
        episodes=EpisodeSettings(
            tokenizer=str(tiny_calc_model), env_id="agentrl/Calc-v0", env_kwargs={"sandbox": FakeSandbox()},
            sandbox_kind=None, sandbox_kwargs={}, sampling={}, max_new_tokens=16, max_episode_tokens=512, seed=0,
        ),
        generators=gens, max_concurrent_episodes=16, generate_timeout_s=10,
    )

    async def main():
        async with anyio.create_task_group() as tg:
            for i in range(4):
                tg.start_soon(worker.run_group, ROW, i, f"g{i}", 3)

    anyio.run(main)
    assert len(gens[0].calls) == 6 and len(gens[1].calls) == 6  # 4 groups of 3 split 2/2
    # affinity (not round-robin): every episode of a group went to one generator; episodes are
    # told apart by their first turn's seed
    from agentrl.engine.episodes.env_episode import episode_seed

    for i in range(4):
        seeds = {episode_seed(0, i, j, 0) for j in range(3)}
        owners = [k for k, g in enumerate(gens) if seeds & set(g.calls)]
        assert len(owners) == 1 and seeds <= set(gens[owners[0]].calls), (i, [g.calls for g in gens])
    assert worker.outstanding == [0, 0]


def test_an_episode_says_how_long_it_waited_for_the_generator_and_for_the_environment(tok_with_template):
    import time

    tok = tok_with_template(None)
    scripted = ScriptedGenerator(tok, ["<code>print(12*34+5)</code>", "It is \\boxed{413}<|im_end|>"])

    async def slow_generator(ids, params):
        await anyio.sleep(0.2)
        return await scripted(ids, params)

    def slow_reply(code):
        time.sleep(0.3)  # the sandbox's time, blocking like a real execution's wait
        return __import__("agentrl.sandbox.testing", fromlist=["exec_in_process"]).exec_in_process(code)

    env = CalcEnv(sandbox=FakeSandbox(reply=slow_reply), max_turns=3)
    t = anyio.run(lambda: play_episode(env, tok, slow_generator, row=ROW, group_id="g", prompt_index=0, sample_index=0, seed=0,
                                       sampling={}, max_new_tokens=64, max_episode_tokens=1024))
    assert t.status == "ok" and t.metrics["turns"] == 2
    assert 0.4 <= t.metrics["generate_s"] < 0.6  # two turns of 0.2 s
    assert 0.3 <= t.metrics["env_s"] < 0.45  # one code block
    assert t.metrics["latency_s"] >= t.metrics["generate_s"] + t.metrics["env_s"]
