"""SmolLM2-135M-Instruct, a real pretrained model, through the engine's parts in one process.

One vLLM engine (agentrl's ``VllmGenerator``, CPU) and one FSDP2 learner rank share the test:

1. multi-turn episodes with tool messages through SmolLM2's real ChatML template: every turn's
   prompt is the previous prompt plus exactly the ids the model generated plus the template's
   glue, and the glue is what the template renders (token-in/token-out, nothing re-tokenised);
2. vLLM's per-token log-probs and weight versions;
3. the learner's log-probs on the same tokens match vLLM's within MAX_ABS_TOL / MEAN_ABS_TOL;
4. an in-flight weight update from disk, then one over a gloo weight-transfer group: after each,
   greedy tokens carry the new version and vLLM's log-probs match the learner's new weights;
   in the request that spanned the disk update, every token's behaviour log-prob is that of the
   version that sampled it, and the learner's importance weights (decoupled PPO) and mismatch
   metrics are computed from exactly those per-token values.

Checkpoint, kill, resume and export with a vLLM OpenAI server: test_smollm2_run_e2e.py.
"""

from __future__ import annotations

import asyncio
import math
from typing import Any

import pytest
import torch

from agentrl.envs.base import TextEnv
from tests.engine.training.test_learner_correctness import make_learner

pytestmark = [pytest.mark.vllm, pytest.mark.e2e]

MAX_ABS_TOL = 3e-4
"""Largest |log pi_learner - log pi_vLLM| per token allowed (nats), float32 on CPU. SmolLM2 has 30
layers and a 49,152-token vocabulary: vLLM's CPU kernels and transformers' SDPA path round
differently; benchmarks/RESULTS.md gives the measured values."""
MEAN_ABS_TOL = 3e-5
"""Mean |difference| over all generated tokens allowed."""


def _opening(question: str) -> list[dict[str, str]]:
    return [
        {"role": "system", "content": "You are a helpful assistant. Use the <code> tool when it helps."},
        {"role": "user", "content": question},
    ]


class Chatter(TextEnv):
    """Three turns: after each assistant turn a tool message and a user nudge come back."""

    def initial_messages(self, row: dict[str, Any]) -> list[dict[str, str]]:
        self.actions: list[str] = []
        return _opening(row["question"])

    async def astep(self, action: str):  # type: ignore[override]
        self.turn += 1
        self.actions.append(action)
        if self.turn >= 3:
            return [], 0.0, True, False, self.make_info("ok")
        obs = [
            {"role": "tool", "content": f"<interpreter>\n{self.turn * 1234}\n</interpreter>"},
            {"role": "user", "content": "Go on, in one sentence."},
        ]
        return obs, 0.0, False, False, self.make_info("ok")


def _sample(traj: Any, advantage: float) -> dict[str, Any]:
    return {
        "tokens": traj.tokens, "loss_mask": traj.loss_mask, "behaviour_logprobs": traj.behaviour_logprobs,
        "versions": traj.versions, "advantage": advantage,
    }


def _hf_logprobs(model: str, tokens: list[int], start: int) -> list[float]:
    """log pi(tokens[t] | tokens[:t]) for t >= ``start`` under the weights in ``model``, with
    transformers (float32, full logits)."""
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32).eval()
    with torch.no_grad():
        logits = hf(torch.tensor([tokens])).logits[0].float()
    lp = torch.log_softmax(logits[start - 1:-1], -1)
    return lp.gather(-1, torch.tensor(tokens[start:])[:, None]).squeeze(-1).tolist()


def _mismatch(learner: Any, samples: list[dict[str, Any]]) -> tuple[float, float, int]:
    mine = learner.compute_logprobs(samples)
    diffs = [abs(a - b) for s, lp in zip(samples, mine) for a, b, m in zip(lp, s["behaviour_logprobs"], s["loss_mask"]) if m]
    return max(diffs), sum(diffs) / len(diffs), len(diffs)


def test_smollm2_through_generation_learning_and_weight_updates(smol_model, tmp_path) -> None:
    from agentrl.engine.generation.generator import EngineSettings, VllmGenerator
    from agentrl.engine.episodes.env_episode import play_episode
    from agentrl.models.loading import load_tokenizer
    from tests.engine.generation.local_send import send_over_gloo

    tok = load_tokenizer(str(smol_model))
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    questions = ["What is 17 times 23?", "Write Python that prints the first five squares."]

    async def main() -> None:
        gen = VllmGenerator(
            EngineSettings(model=str(smol_model), max_model_len=1024, kv_cache_gib=0.25, weight_transfer="gloo"),
            timeout_s=180,
        )
        await gen.start()
        learner = None
        try:
            calls: dict[str, list[tuple[list[int], Any]]] = {}

            def recorder(key: str):
                async def generate(ids: list[int], params: dict[str, Any]):
                    out = await gen.generate(ids, params)
                    calls.setdefault(key, []).append((list(ids), out))
                    return out
                return generate

            envs = [Chatter() for _ in questions]
            sampling = {"temperature": 1.0, "stop": ["</code>"]}
            trajs = await asyncio.gather(*[
                play_episode(env, tok, recorder(str(i)), row={"question": q}, group_id=str(i), prompt_index=i, sample_index=0,
                             seed=3, sampling=sampling, max_new_tokens=40, max_episode_tokens=900)
                for i, (env, q) in enumerate(zip(envs, questions))
            ])

            # 1. token-in/token-out through the real template, turn by turn
            for i, (traj, env) in enumerate(zip(trajs, envs)):
                turns = calls[str(i)]
                assert traj.status == "ok" and len(turns) == 3, (traj.status, traj.info)
                messages = _opening(questions[i])
                for k, (prompt, out) in enumerate(turns):
                    assert tok.decode(prompt) == tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
                    if k + 1 < len(turns):
                        nxt = turns[k + 1][0]
                        assert nxt[: len(prompt) + len(out.token_ids)] == prompt + out.token_ids  # never re-tokenised
                        glue = nxt[len(prompt) + len(out.token_ids):]
                        if not out.token_ids or out.token_ids[-1] != im_end:
                            assert glue[0] == im_end  # the template closes a turn that stopped on </code> or length
                        messages = messages + [
                            {"role": "assistant", "content": env.actions[k]},
                            {"role": "tool", "content": f"<interpreter>\n{(k + 1) * 1234}\n</interpreter>"},
                            {"role": "user", "content": "Go on, in one sentence."},
                        ]
                last_prompt, last = turns[-1]
                assert traj.tokens == last_prompt + last.token_ids
                generated = {p for prompt, out in turns for p in range(len(prompt), len(prompt) + len(out.token_ids))}
                assert [j for j, m in enumerate(traj.loss_mask) if m] == sorted(generated)

                # 2. log-probs and versions per generated token
                for j, m in enumerate(traj.loss_mask):
                    if m:
                        assert math.isfinite(traj.behaviour_logprobs[j]) and traj.behaviour_logprobs[j] <= 0
                        assert traj.versions[j] == 0
                    else:
                        assert traj.versions[j] == -1 and traj.behaviour_logprobs[j] == 0.0

            # 3. the learner's log-probs on vLLM's tokens
            learner = make_learner(str(smol_model), lr=3e-3, grad_clip=1.0, micro_batch_tokens=4096, logprob_chunk_tokens=256)
            samples = [_sample(t, a) for t, a in zip(trajs, (1.0, -1.0))]
            worst, mean, n = _mismatch(learner, samples)
            print(f"SmolLM2 learner vs vLLM over {n} generated tokens: max |dlogp| {worst:.3g}, mean {mean:.3g}")
            assert n > 60 and worst < MAX_ABS_TOL and mean < MEAN_ABS_TOL
            metrics = learner.train_step(samples)
            assert metrics["current_version_tokens"] == n and math.isfinite(metrics["loss"])

            text = tok.apply_chat_template([{"role": "user", "content": "Compute 347*58+91."}], tokenize=False, add_generation_prompt=True)
            probe = tok.encode(text, add_special_tokens=False)
            greedy = {"max_tokens": 24, "temperature": 0.0, "ignore_eos": True}

            async def check_version(version: int) -> None:
                out = await gen.generate(probe, greedy)
                assert out.versions == [version] * 24
                s = {"tokens": probe + out.token_ids, "loss_mask": [0] * len(probe) + [1] * 24,
                     "behaviour_logprobs": [0.0] * len(probe) + out.logprobs}
                w, m, _ = _mismatch(learner, [s])
                print(f"version {version}: learner vs vLLM max |dlogp| {w:.3g}, mean {m:.3g}")
                assert w < MAX_ABS_TOL and m < MEAN_ABS_TOL

            before = await gen.generate(probe, greedy)

            # 4a. disk: publish, reload in flight (a long request spans the update)
            path = learner.publish(str(tmp_path / "weights" / "v000001"))
            long = asyncio.ensure_future(gen.generate(probe, {"max_tokens": 200, "temperature": 1.0, "ignore_eos": True, "seed": 1}))
            await asyncio.sleep(1.5)
            assert not long.done()
            stall = await gen.update_weights(1, path)
            spanning = await long
            # the request was in flight across the update: its first tokens are version 0, its last version 1
            assert len(spanning.token_ids) == 200 and spanning.versions[0] == 0 and spanning.versions[-1] == 1
            assert spanning.versions == sorted(spanning.versions)
            print(f"disk update: stall {stall:.2f} s, versions in the spanning request {sorted(set(spanning.versions))}")
            await check_version(1)
            after = await gen.generate(probe, greedy)
            assert max(abs(a - b) for a, b in zip(before.logprobs, after.logprobs)) > 1e-4  # the weights moved

            # 4c. off-policy bookkeeping at staleness > 0: in the request that spanned the update,
            # each token's behaviour log-prob is that of the version that sampled it (recomputed
            # under v0 with transformers, under v1 by the learner), and the learner's importance
            # weights and mismatch metrics are built from exactly those values.
            span = {"tokens": probe + spanning.token_ids, "loss_mask": [0] * len(probe) + [1] * 200,
                    "behaviour_logprobs": [0.0] * len(probe) + spanning.logprobs,
                    "versions": [-1] * len(probe) + spanning.versions, "advantage": 1.0}
            lp1 = learner.compute_logprobs([span])[0][len(probe):]
            lp0 = _hf_logprobs(str(smol_model), span["tokens"], len(probe))
            behav, vers = spanning.logprobs, spanning.versions
            v0 = [i for i, v in enumerate(vers) if v == 0]
            v1 = [i for i, v in enumerate(vers) if v == 1]
            def gap(a: list[float], idx: list[int]) -> tuple[float, float]:
                d = [abs(behav[i] - a[i]) for i in idx]
                return max(d), sum(d) / len(d)

            apart = max(abs(lp0[i] - lp1[i]) for i in range(200))
            print(f"spanning request: {len(v0)} tokens of v0, {len(v1)} of v1; v0 vs v1 log-probs differ by up to {apart:.3g}; "
                  f"behaviour vs (max, mean): v0 tokens under v0 {gap(lp0, v0)}, under v1 {gap(lp1, v0)}; "
                  f"v1 tokens under v1 {gap(lp1, v1)}, under v0 {gap(lp0, v1)}")
            assert apart > 10 * MAX_ABS_TOL  # the two versions are told apart, so the matches below mean something
            assert gap(lp0, v0)[0] < MAX_ABS_TOL and gap(lp1, v1)[0] < MAX_ABS_TOL
            assert gap(lp1, v0)[1] > 10 * gap(lp0, v0)[1] and gap(lp0, v1)[1] > 10 * gap(lp1, v1)[1]
            w = [min(math.exp(lp1[i] - behav[i]), 2.0) for i in range(200)]  # decoupled PPO's weight, is_cap 2
            m = learner.train_step([span])
            assert m["current_version_tokens"] == len(v1) and m["trained_tokens"] == 200
            assert m["is_weight_mean"] == pytest.approx(sum(w) / 200, abs=1e-5)
            assert m["logprob_abs_diff"] == pytest.approx(sum(abs(lp1[i] - behav[i]) for i in range(200)) / 200, abs=1e-5)
            assert m["logprob_abs_diff_current"] == pytest.approx(sum(abs(lp1[i] - behav[i]) for i in v1) / len(v1), abs=1e-5)
            # discriminating: had the learner taken its own log-probs as the behaviour, both would read 1 and 0
            assert sum(abs(lp1[i] - behav[i]) for i in range(200)) / 200 > 10 * 1e-5

            # 4b. gloo: the learner's parameters broadcast straight into the vLLM worker
            learner.train_step([_sample(t, a) for t, a in zip(trajs, (-1.0, 1.0))])
            await send_over_gloo(gen, learner.policy.lm, 2, torch.float32)
            assert gen.version == 2
            await check_version(2)
        finally:
            if learner is not None:
                learner.shutdown()
            await gen.shutdown()

    asyncio.run(main())
