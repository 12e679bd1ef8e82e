"""A peer, side by side: TRL's ``GRPOTrainer`` on agentrl's tiny calculator task (issue 22).

Same start (the tiny SFT checkpoint ``runs/tiny_calc/sft``), same task (``agentrl/Calc-v0``: the
model writes Python in ``<code>...</code>``, the interpreter answers in ``<interpreter>``, up to 3
turns, reward 1 for the right ``\\boxed{}``), same machine, same samples (120 steps x 32 episodes =
8 prompts x 4), same held-out measurement (agentrl's own evaluator, ``agentrl train ... mode="eval"``,
on the same 128 problems at temperature 1.0, on checkpoints TRL saves every ``--save-every`` steps).
agentrl's side runs in the same invocation, right after TRL's (``agentrl train
recipes/tiny_calc.toml`` from the same SFT checkpoint, ``--steps`` learner steps, evaluated every
``--save-every`` steps), so that both sides see the same machine and load; ``--agentrl-run DIR``
reads an existing run instead (the block then says so).

The TRL setup, and what differs from agentrl's
-----------------------------------------------
- **Trainer**: ``trl.GRPOTrainer`` (TRL 1.16, ``pip install -e '.[bench]'``), CPU, fp32, generation
  with Hugging Face ``generate`` (TRL's default; its vLLM modes need a GPU or a vLLM server), no
  gradient checkpointing, dropout off (as TRL does by default).
- **Multi-turn tool use**: TRL's built-in tool loop (``tools=`` / ``environment_factory=``) parses
  tool calls with the chat template's response schema (Hermes-style ``<tool_call>{json}</tool_call>``)
  and renders tool results with the template's ``tool`` role; the tiny model was SFT-trained on
  ReTool-style ``<code>`` blocks, and its template has no response schema, so that loop cannot
  drive it. The closest TRL setup is TRL's ``rollout_func`` hook (experimental, the one TRL documents
  for custom multi-turn environments), written here to do what TRL's own tool loop does, in
  agentrl's format: generate one turn for every open episode in a batch with TRL's own
  ``GRPOTrainer._generate_single_turn`` (HF ``generate`` under ``unwrap_model_for_generation``,
  TRL's generation config: temperature 1.0, top-p 1, ``max_completion_length`` = 48 new tokens per
  turn), hand each turn to agentrl's ``CalcEnv`` (``agentrl.envs.make_env("agentrl/Calc-v0",
  max_turns=3)``, code run in agentrl's bubblewrap sandbox with the recipe's limits), append the
  template glue with agentrl's ``IncrementalRenderer`` (so token streams are built exactly as
  agentrl builds them), and return ``env_mask`` (TRL's name for the loss mask: tool output and
  glue are not trained on). Turns stop at ``</code>`` (a single token in the tiny tokenizer, added
  to the EOS ids of TRL's generation config and of its completion masking) or ``<|im_end|>``.
- **Reward**: the environment's own (``CalcEnv.score``: last ``\\boxed{}`` equal to the answer),
  passed to TRL as an extra rollout field and returned by a one-line reward function; so correctness
  is judged identically.
- **Objective**: ``loss_type="dapo"`` (TRL's default: token-mean over the batch, as agentrl's
  ``token-mean``), ``epsilon=0.2``, ``epsilon_high=0.28`` (agentrl's clip 0.2/0.28), ``beta=0`` (no
  KL, as agentrl), ``scale_rewards="group"`` (group mean and std, as agentrl's ``grpo``
  advantage), ``num_iterations=1``. TRL is on-policy (generate, then one step), so its ratio is 1
  and clipping never acts; agentrl is asynchronous (a step trains on samples up to one version
  old, ``max_staleness = 1``) with decoupled clipping and a dual clip of 3 — the one algorithmic
  difference, inherent to the two designs.
- **Optimiser**: AdamW, lr 1e-4 constant, no warm-up, betas (0.9, 0.999), eps 1e-8, no weight
  decay, gradient norm clipped at 1.0 (agentrl's defaults); one optimiser step per 32 episodes.
- **Data**: the same 512 training rows (``load_rows("synthetic:calc", limit=512, seed=0)``), in
  TRL's sampler order (seed 0) rather than agentrl's; the held-out rows are agentrl's eval split
  (``load_rows(..., split="test", limit=128, seed=0)``), read by agentrl's evaluator itself.
- **Clock**: TRL's training seconds at a checkpoint = wall-clock since ``on_train_begin``, minus
  the time spent saving checkpoints (model loading and trainer set-up excluded, as agentrl's "RL s"
  excludes Ray/vLLM start-up and evaluation). Evaluation runs afterwards, one ``agentrl train
  mode="eval"`` per checkpoint.

Commands (every heavy command under the shared lock)::

    # smoke: 2 steps, no evaluation
    flock /tmp/agentrl-heavy.lock .venv/bin/python benchmarks/trl_peer.py --steps 2 --save-every 2 --no-eval --out runs/bench_trl_peer_smoke
    # the full run: 120 steps, checkpoints every 20, each evaluated by agentrl, table printed
    # (add --write to also put it into RESULTS.md)
    flock /tmp/agentrl-heavy.lock .venv/bin/python benchmarks/trl_peer.py --steps 120 --save-every 20
    # re-read that run's clock and evaluations (no training, no evaluation) and write the block
    .venv/bin/python benchmarks/trl_peer.py --steps 120 --save-every 20 --reuse --write
    # which runs, per checkpoint, agentrl's evaluator:
    .venv/bin/agentrl train recipes/tiny_calc.toml --set mode="eval" --set model.path="runs/bench_trl_peer/ckpt-20" \\
        --set sft.steps=0 --set run_dir="runs/bench_trl_peer/eval-20"
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _measure import emit, eval_curve, run_header
from ppo_vs_grpo import train as agentrl_train

ROOT = Path(__file__).resolve().parent.parent
RECIPE = "recipes/tiny_calc.toml"
SAMPLES_PER_STEP = 32


# ------------------------------------------------------------------ the rollout TRL runs


class CalcRollout:
    """TRL ``rollout_func``: multi-turn Calc-v0 episodes, one HF ``generate`` call per turn for all
    open episodes of the batch, agentrl's environment and renderer between turns."""

    def __init__(self, recipe: Any, tokenizer: Any, rows: list[dict[str, Any]]) -> None:
        from agentrl.sandbox import create_sandbox

        self.recipe = recipe
        self.tokenizer = tokenizer
        self.answers = {r["question"]: r for r in rows}
        sb = recipe.sandbox
        kwargs: dict[str, Any] = {"max_concurrency": sb.max_concurrency, "timeout_s": sb.timeout_s, "memory_mb": sb.memory_mb}
        if sb.preload is not None:
            kwargs["preload"] = sb.preload
        self.loop = asyncio.new_event_loop()
        self.sandbox = create_sandbox(sb.type, **kwargs)
        self.max_turns = int(recipe.env.kwargs.get("max_turns", 3))
        self.max_episode_tokens = min(recipe.rollout.max_episode_tokens, recipe.generator.max_model_len)
        self.max_new_tokens = recipe.rollout.max_new_tokens
        self.generate_s = self.env_s = 0.0
        self.samples_path: Path | None = None

    def close(self) -> None:
        self.loop.run_until_complete(self.sandbox.aclose())
        self.loop.close()

    def __call__(self, prompts: list[list[dict[str, str]]], trainer: Any) -> dict[str, Any]:
        from agentrl.engine.episodes.render import IncrementalRenderer
        from agentrl.envs import make_env

        n = len(prompts)
        envs, renderers, prompt_ids = [], [], []
        for messages in prompts:
            row = self.answers[messages[-1]["content"]]
            env = make_env(self.recipe.env.id, **{**self.recipe.env.kwargs, "sandbox": self.sandbox})
            env.unwrapped.reset(options={"row": row})
            envs.append(env)
            renderers.append(IncrementalRenderer(self.tokenizer, messages))
            prompt_ids.append(renderers[-1].prompt_ids())
        completion: list[list[int]] = [[] for _ in range(n)]
        mask: list[list[int]] = [[] for _ in range(n)]
        reward = [0.0] * n
        turns = [0] * n
        tool_calls = [0] * n
        open_ = list(range(n))
        while open_:
            # one turn for every open episode: TRL's own HF-generate path
            budgets = {i: min(self.max_new_tokens, self.max_episode_tokens - len(prompt_ids[i]) - len(completion[i])) for i in open_}
            open_ = [i for i in open_ if budgets[i] > 0]  # agentrl: status "overflow"
            if not open_:
                break
            t0 = time.monotonic()
            ids, _ = trainer._generate_single_turn([prompt_ids[i] + completion[i] for i in open_], None, {}, 1)
            self.generate_s += time.monotonic() - t0
            texts = []
            for i, gen in zip(open_, ids):
                gen = list(gen)[: budgets[i]]
                completion[i] += gen
                mask[i] += [1] * len(gen)
                turns[i] += 1
                texts.append(self.tokenizer.decode(gen, skip_special_tokens=False))
            t0 = time.monotonic()
            async def step_all(pairs: list[tuple[int, str]]) -> list[Any]:
                return await asyncio.gather(*(envs[i].unwrapped.astep(renderers[i].strip_special_suffix(t)) for i, t in pairs))

            steps = self.loop.run_until_complete(step_all(list(zip(open_, texts))))
            self.env_s += time.monotonic() - t0
            still = []
            for i, text, (obs, r, terminated, truncated, info) in zip(open_, texts, steps):
                reward[i] += float(r)
                tool_calls[i] = int(info.get("tool_calls", tool_calls[i]))
                if terminated or truncated or turns[i] >= self.max_turns:
                    continue
                glue = renderers[i].append_turn(text, obs)
                if len(prompt_ids[i]) + len(completion[i]) + len(glue) >= self.max_episode_tokens:
                    continue  # agentrl: status "overflow"
                completion[i] += glue
                mask[i] += [0] * len(glue)
                still.append(i)
            open_ = still
        if self.samples_path is not None:  # one readable episode per batch
            with open(self.samples_path, "a") as f:
                f.write(json.dumps({"step": trainer.state.global_step, "episodes": n, "reward": reward[0], "turns": turns[0],
                                    "text": self.tokenizer.decode(prompt_ids[0] + completion[0])}) + "\n")
        return {"prompt_ids": prompt_ids, "completion_ids": completion, "logprobs": None, "env_mask": mask,
                "env_reward": reward, "env_tool_calls": tool_calls}


def env_reward(prompts: list, completions: list, env_reward: list[float], **_: Any) -> list[float]:
    """The reward agentrl's CalcEnv gave the episode (computed during the rollout)."""
    return list(env_reward)


# ------------------------------------------------------------------ training


def train_trl(args: argparse.Namespace, out: Path) -> list[dict[str, Any]]:
    """Run GRPOTrainer for ``args.steps`` steps, saving ``out/ckpt-<step>`` every ``args.save_every``;
    return ``[{step, train_s}]`` (step 0 = the SFT checkpoint, 0 s) and write ``out/trl_clock.json``."""
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from agentrl.config import load_recipe
    from agentrl.envs.data import load_rows

    torch.manual_seed(0)
    torch.set_num_threads(os.cpu_count() or 1)
    recipe = load_recipe(ROOT / RECIPE)
    sft = str(ROOT / args.sft)
    tokenizer = AutoTokenizer.from_pretrained(sft, padding_side="left")
    model = AutoModelForCausalLM.from_pretrained(sft, dtype=torch.float32)
    rows = load_rows(recipe.data.source, limit=recipe.data.limit, seed=recipe.seed)
    env = __import__("agentrl.envs", fromlist=["make_env"]).make_env(recipe.env.id, **recipe.env.kwargs)
    dataset = Dataset.from_list([{"prompt": env.unwrapped.initial_messages(r)} for r in rows])
    stop_ids = [tokenizer.convert_tokens_to_ids(t) for t in (tokenizer.eos_token, *recipe.rollout.stop)]
    assert all(isinstance(i, int) and i >= 0 for i in stop_ids), stop_ids

    config = GRPOConfig(
        output_dir=str(out / "trainer"),
        max_steps=args.steps,
        per_device_train_batch_size=SAMPLES_PER_STEP,
        gradient_accumulation_steps=1,
        num_generations=recipe.rollout.group_size,
        learning_rate=recipe.learner.lr,
        lr_scheduler_type="constant",
        warmup_steps=0,
        weight_decay=recipe.learner.weight_decay,
        adam_beta1=recipe.learner.betas[0],
        adam_beta2=recipe.learner.betas[1],
        adam_epsilon=recipe.learner.adam_eps,
        max_grad_norm=recipe.learner.grad_clip,
        optim="adamw_torch",
        temperature=recipe.rollout.temperature,
        top_p=recipe.rollout.top_p,
        max_completion_length=recipe.rollout.max_new_tokens,
        generation_kwargs={"eos_token_id": stop_ids},
        beta=recipe.algo.kl_coef,
        loss_type="dapo",
        epsilon=recipe.algo.clip_low,
        epsilon_high=recipe.algo.clip_high,
        scale_rewards="group",
        num_iterations=1,
        use_vllm=False,
        use_cpu=True,
        bf16=False,
        fp16=False,
        gradient_checkpointing=False,
        seed=recipe.seed,
        data_seed=recipe.seed,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
    )
    rollout = CalcRollout(recipe, tokenizer, rows)
    rollout.samples_path = out / "samples.jsonl"
    rollout.samples_path.unlink(missing_ok=True)
    clock: list[dict[str, Any]] = [{"step": 0, "train_s": 0.0, "path": sft}]
    train_logs: list[dict[str, Any]] = []

    class Clock(TrainerCallback):
        start = 0.0
        saving = 0.0

        def on_train_begin(self, a, state, control, **kw):
            self.start = time.monotonic()

        def on_log(self, a, state, control, logs=None, **kw):
            if logs:
                train_logs.append({"step": state.global_step, **{k: v for k, v in logs.items() if isinstance(v, (int, float))}})

        def on_step_end(self, a, state, control, model=None, **kw):
            step = state.global_step
            if step % args.save_every and step != args.steps:
                return
            at = time.monotonic() - self.start - self.saving
            t0 = time.monotonic()
            path = out / f"ckpt-{step}"
            trainer.model.save_pretrained(path)
            tokenizer.save_pretrained(path)
            self.saving += time.monotonic() - t0
            clock.append({"step": step, "train_s": at, "path": str(path), "generate_s": rollout.generate_s, "env_s": rollout.env_s})
            print(f"checkpoint {path}: step {step}, {at:.1f} s of training", flush=True)

    trainer = GRPOTrainer(model=model, reward_funcs=env_reward, args=config, train_dataset=dataset,
                          processing_class=tokenizer, rollout_func=rollout, callbacks=[Clock()])
    # `</code>` ends a turn: TRL's completion masking must treat it as an end like EOS.
    trainer.eos_token_ids = stop_ids
    try:
        trainer.train()
    finally:
        rollout.close()
    (out / "trl_clock.json").write_text(json.dumps(clock, indent=1))
    (out / "trl_logs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in train_logs))
    return clock


# ------------------------------------------------------------------ evaluation with agentrl's evaluator


def evaluate(path: str, run_dir: Path) -> dict[str, Any]:
    """Held-out accuracy of the checkpoint ``path`` by agentrl's evaluator (``mode="eval"``):
    the recipe's 128 eval-split problems at temperature 1.0; the eval record of its metrics.jsonl."""
    metrics = run_dir / "metrics.jsonl"
    if not metrics.is_file():
        cmd = [str(ROOT / ".venv/bin/agentrl"), "train", RECIPE, "--set", 'mode="eval"', "--set", f'model.path="{path}"',
               "--set", "sft.steps=0", "--set", f'run_dir="{run_dir}"']
        run_dir.parent.mkdir(parents=True, exist_ok=True)
        with open(f"{run_dir}.log", "w") as log:
            rc = subprocess.run(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, timeout=1800, check=False).returncode
        if rc:
            raise SystemExit(f"{' '.join(cmd)} failed ({rc}); see {run_dir}.log")
    recs = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    return [r for r in recs if r.get("kind") == "eval"][-1]


def agentrl_curve(run_dir: Path) -> tuple[list[dict[str, Any]], float, int]:
    """agentrl's ``[{version, rl_s, accuracy}]`` (RL wall-clock without evaluation time, as
    ppo_vs_grpo computes it), its total RL seconds and its number of steps."""
    out = eval_curve(str(run_dir))
    return out, out[-1]["rl_s"], out[-1]["version"]


def faster(trl_rate: float, agentrl_rate: float) -> str:
    """Which side has the higher training throughput, and by how much."""
    if trl_rate >= agentrl_rate:
        return f"TRL is {trl_rate / agentrl_rate:.2f}x agentrl's rate"
    return f"agentrl is {agentrl_rate / trl_rate:.2f}x TRL's rate"


def first_reaching(curve: list[dict[str, Any]], threshold: float) -> dict[str, Any] | None:
    """The first evaluation of ``curve`` at or above ``threshold``, or None."""
    return next((p for p in curve if p["accuracy"] >= threshold - 1e-9), None)


# ------------------------------------------------------------------ report


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=120, help="TRL optimiser steps (32 episodes each)")
    ap.add_argument("--save-every", type=int, default=20, help="checkpoint (and evaluate) every this many steps")
    ap.add_argument("--sft", default="runs/tiny_calc/sft", help="the SFT checkpoint both sides start from")
    ap.add_argument("--agentrl-run", default=None,
                    help="read agentrl's side from this existing run (same recipe) instead of running it now")
    ap.add_argument("--threshold", type=float, default=0.6, help="held-out accuracy for 'wall-clock to the same accuracy'")
    ap.add_argument("--out", default="runs/bench_trl_peer")
    ap.add_argument("--no-eval", action="store_true", help="train only (smoke test)")
    ap.add_argument("--reuse", action="store_true", help="reuse out/trl_clock.json instead of training again")
    ap.add_argument("--write", action="store_true", help="write the results into benchmarks/RESULTS.md")
    args = ap.parse_args()
    started = time.time()
    out = ROOT / args.out
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    if args.reuse and (out / "trl_clock.json").is_file():
        clock = json.loads((out / "trl_clock.json").read_text())
        command_s = float((out / "trl_command_s.txt").read_text())
    else:
        clock = train_trl(args, out)
        command_s = time.monotonic() - t0
        (out / "trl_command_s.txt").write_text(f"{command_s:.1f}\n")
    for c in clock:
        print(f"TRL step {c['step']}: {c['train_s']:.1f} s", flush=True)
    if args.no_eval:
        return

    agentrl = None
    if args.agentrl_run:
        run_dir = ROOT / args.agentrl_run
        same_run = f"agentrl's side read from an earlier run, `{args.agentrl_run}`, not measured in this invocation"
    else:
        run_dir = out / "agentrl"
        if not (args.reuse and (run_dir / "metrics.jsonl").is_file()):
            print("agentrl: the same task from the same SFT checkpoint, now", flush=True)
            agentrl_train(RECIPE, run_dir, [f'model.path="{args.sft}"', "sft.steps=0", f"learner.max_steps={args.steps}",
                                            f"eval.every_steps={args.save_every}"])
        same_run = "agentrl's side run in this invocation, right after TRL's"
    trl = []
    for c in clock:
        rec = evaluate(c["path"], out / f"eval-{c['step']}")
        trl.append({"step": c["step"], "train_s": c["train_s"], "accuracy": rec["accuracy"],
                    "tool_call_rate": rec.get("tool_call_rate", 0.0), "generate_s": c.get("generate_s", 0.0)})
        print(f"TRL step {c['step']}: {c['train_s']:.0f} s, held-out accuracy {rec['accuracy']:.3f}", flush=True)
    last = trl[-1]
    trl_rate = SAMPLES_PER_STEP * last["step"] / last["train_s"]

    lines = [run_header(started), "",
             (f"Both from `{args.sft}`, Calc-v0 with the Python tool (up to 3 turns, 48 new tokens a turn), 32 episodes "
             f"(8 prompts x 4) per optimiser step, lr 1e-4 constant, no KL, clip 0.2/0.28; held-out accuracy measured by "
             f"agentrl's evaluator on the same 128 problems at temperature 1.0 (one seed: +-4 points is noise). TRL "
             f"{__import__('trl').__version__}: `GRPOTrainer` with HF `generate` on the CPU and a `rollout_func` that runs agentrl's "
             f"Calc-v0 environment between turns (the script's docstring lists every difference). Seconds: training only "
             f"(no start-up, no evaluation). {same_run}."), "",
             "| trainer | step | training s | held-out accuracy |", "| --- | --- | --- | --- |"]
    for p in trl:
        lines.append(f"| TRL GRPOTrainer | {p['step']} | {p['train_s']:.0f} | {p['accuracy']:.3f} |")
    if (run_dir / "metrics.jsonl").is_file():
        agentrl, a_s, a_steps = agentrl_curve(run_dir)
        for p in agentrl:
            lines.append(f"| agentrl (async GRPO, vLLM) | {p['version']} | {p['rl_s']:.0f} | {p['accuracy']:.3f} |")
    lines.append("")
    lines.append(f"- samples/s (training): TRL {trl_rate:.2f} ({SAMPLES_PER_STEP} x {last['step']} episodes in {last['train_s']:.0f} s, "
                 f"of which {last['generate_s']:.0f} s in HF generate); " +
                 (f"agentrl {SAMPLES_PER_STEP * a_steps / a_s:.2f} ({SAMPLES_PER_STEP} x {a_steps} in {a_s:.0f} s); "
                  + faster(trl_rate, SAMPLES_PER_STEP * a_steps / a_s) if agentrl else "agentrl: run missing"))
    if agentrl:
        curves = {"TRL": [{"accuracy": p["accuracy"], "s": p["train_s"], "step": p["step"]} for p in trl],
                  "agentrl": [{"accuracy": p["accuracy"], "s": p["rl_s"], "step": p["version"]} for p in agentrl]}
        for threshold, why in ((args.threshold, "fixed threshold"), (trl[-1]["accuracy"], "TRL's accuracy at its last step")):
            hits = []
            for name, curve in curves.items():
                hit = first_reaching(curve, threshold)
                hits.append(f"{name} {hit['s']:.0f} s (step {hit['step']})" if hit else
                            f"{name} not reached (best {max(p['accuracy'] for p in curve):.3f})")
            lines.append(f"- wall-clock to held-out accuracy >= {threshold:.3f} ({why}; first evaluation reaching it): " + ", ".join(hits))
        a_start = next(json.loads(x)["time"] for x in (run_dir / "metrics.jsonl").read_text().splitlines() if '"loop_start"' in x)
        lines.append(f"- start-up not counted above: agentrl {a_start:.0f} s before its RL loop (Ray, vLLM engine, sandbox, the "
                     f"step-0 evaluation); TRL's whole command (model load, trainer set-up, training, saving) took {command_s:.0f} s")
    else:
        lines.append(f"- TRL whole command (model load, trainer set-up, training, saving): {command_s:.0f} s")
    emit("\n".join(lines), "trl_peer", args.write, section="A peer: TRL's GRPOTrainer")


if __name__ == "__main__":
    main()
