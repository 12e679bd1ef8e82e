"""Tiny model building, tokenizer properties and the general loading path (plus one vLLM load)."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch
import transformers
from transformers import LogitsProcessor, LogitsProcessorList

from agentrl.errors import ModelError
from agentrl.models import (
    TOOL_TOKENS,
    TinyModelSpec,
    build_tiny_model,
    load_causal_lm,
    load_tokenizer,
    looks_like_local_path,
)


def calculator_texts(n: int = 200, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    texts = []
    for _ in range(n):
        a, b, c = rng.randint(100, 999), rng.randint(10, 99), rng.randint(10, 99)
        texts.append(
            f"Compute {a}*{b}+{c}. <code>print({a}*{b}+{c})</code>"
            f"<interpreter>{a * b + c}</interpreter> The answer is \\boxed{{{a * b + c}}}"
        )
    return texts


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "model", calculator_texts())


@pytest.fixture(scope="module")
def tok(model_dir: Path):
    return load_tokenizer(str(model_dir))


CONVERSATION = [
    {"role": "system", "content": "You are a calculator."},
    {"role": "user", "content": "Compute 123*45+6."},
    {"role": "assistant", "content": "<code>print(123*45+6)</code>"},
    {"role": "tool", "content": "5541"},
    {"role": "assistant", "content": "The answer is \\boxed{5541}"},
]

ROUND_TRIP = [
    "Compute 123*45+6.",
    "  leading and trailing spaces  ",
    "line one\nline two\n\n\ttabbed\r\nwindows",
    "héllo wörld — naïve café, 日本語のテキスト, emoji 🎉🧮, Ω≈ç√∫",
    "<code>print(1/3)</code><interpreter>0.3333333333333333</interpreter>",
    "<|im_start|>user\nhi<|im_end|>\n",
    "\\boxed{-42} {}[]()<>!@#$%^&*_+=~`|'\"",
    "",
]


def test_folder_contents(model_dir: Path) -> None:
    names = {p.name for p in model_dir.iterdir()}
    assert {"config.json", "model.safetensors", "generation_config.json", "tokenizer.json",
            "tokenizer_config.json"} <= names
    config = json.loads((model_dir / "config.json").read_text())
    assert config["model_type"] == "qwen2"
    assert config["dtype"] == "float32"
    assert config["hidden_size"] // config["num_attention_heads"] == 64
    generation = json.loads((model_dir / "generation_config.json").read_text())
    assert generation["eos_token_id"] == 2
    assert not [p for p in model_dir.parent.iterdir() if p.name.startswith(".")]  # temp dirs gone


def test_special_tokens(tok) -> None:
    assert tok.convert_tokens_to_ids(["<|endoftext|>", "<|im_start|>", "<|im_end|>"]) == [0, 1, 2]
    assert tok.eos_token == "<|im_end|>" and tok.eos_token_id == 2
    assert tok.pad_token == "<|endoftext|>" and tok.pad_token_id == 0
    assert len(tok) <= 400
    for t in TOOL_TOKENS:  # atomic, not special: kept by skip_special_tokens
        ids = tok.encode(f"a{t}b", add_special_tokens=False)
        assert t in tok.convert_ids_to_tokens(ids)
        assert t in tok.decode(ids, skip_special_tokens=True)
    assert tok.decode(tok.encode("<|im_start|>x<|im_end|>", add_special_tokens=False),
                      skip_special_tokens=True) == "x"


def test_digits_are_single_tokens(tok) -> None:
    for d in "0123456789":
        assert len(tok.encode(d, add_special_tokens=False)) == 1
    ids = tok.encode("x = 1234567890, 5541", add_special_tokens=False)
    digit_tokens = [t for t in tok.convert_ids_to_tokens(ids) if any(c.isdigit() for c in t)]
    assert digit_tokens == list("12345678905541")
    # No learned merge contains a digit.
    for token in tok.get_vocab():
        if any(c.isdigit() for c in token):
            assert len(token) == 1, token


@pytest.mark.parametrize("text", ROUND_TRIP)
def test_round_trip(tok, text: str) -> None:
    assert tok.decode(tok.encode(text, add_special_tokens=False)) == text


def test_chat_template(tok) -> None:
    text = tok.apply_chat_template(CONVERSATION, tokenize=False, add_generation_prompt=True)
    assert text == (
        "<|im_start|>system\nYou are a calculator.<|im_end|>\n"
        "<|im_start|>user\nCompute 123*45+6.<|im_end|>\n"
        "<|im_start|>assistant\n<code>print(123*45+6)</code><|im_end|>\n"
        "<|im_start|>tool\n5541<|im_end|>\n"
        "<|im_start|>assistant\nThe answer is \\boxed{5541}<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    without = tok.apply_chat_template(CONVERSATION, tokenize=False)
    assert without.endswith("\\boxed{5541}<|im_end|>\n")
    with pytest.raises(Exception, match="Unknown chat role"):
        tok.apply_chat_template([{"role": "robot", "content": "x"}], tokenize=False)


def test_chat_template_is_append_only(tok) -> None:
    for k, message in enumerate(CONVERSATION):
        if message["role"] != "assistant":
            continue
        prompt = tok.apply_chat_template(CONVERSATION[:k], tokenize=False, add_generation_prompt=True)
        full = tok.apply_chat_template(CONVERSATION[: k + 1], tokenize=False)
        assert full.startswith(prompt)
        assert full[len(prompt):] == message["content"] + "<|im_end|>\n"
        # The same holds for token ids: prompt ids + completion ids == ids of the longer render.
        prompt_ids = tok.encode(prompt, add_special_tokens=False)
        full_ids = tok.encode(full, add_special_tokens=False)
        assert full_ids[: len(prompt_ids)] == prompt_ids
        rest = tok.encode(full[len(prompt):], add_special_tokens=False)
        assert prompt_ids + rest == full_ids


def test_load_and_forward(model_dir: Path, tok) -> None:
    ours = load_causal_lm(str(model_dir))
    plain = transformers.AutoModelForCausalLM.from_pretrained(model_dir)
    plain_tok = transformers.AutoTokenizer.from_pretrained(model_dir)
    assert plain_tok.encode("12 <code>") == tok.encode("12 <code>")
    assert ours.dtype == torch.float32 and not ours.training
    assert ours.config.vocab_size >= len(tok)
    ids = torch.tensor([tok.apply_chat_template(CONVERSATION[:2], add_generation_prompt=True)["input_ids"]])
    with torch.no_grad():
        a = ours(input_ids=ids).logits
        b = plain(input_ids=ids).logits
    assert a.shape == (1, ids.shape[1], ours.config.vocab_size)
    assert torch.isfinite(a).all()
    torch.testing.assert_close(a, b)


def test_same_seed_same_weights(tmp_path: Path) -> None:
    texts = calculator_texts(50)
    a = load_causal_lm(str(build_tiny_model(tmp_path / "a", texts)))
    b = load_causal_lm(str(build_tiny_model(tmp_path / "b", texts)))
    c = load_causal_lm(str(build_tiny_model(tmp_path / "c", texts, TinyModelSpec(seed=1))))
    wa, wb, wc = (m.model.embed_tokens.weight for m in (a, b, c))
    assert torch.equal(wa, wb) and not torch.equal(wa, wc)


class _ForceEosAfter(LogitsProcessor):
    """Leaves the first ``n`` new tokens alone, then forces ``eos``."""

    def __init__(self, prompt_len: int, n: int, eos: int) -> None:
        self.prompt_len, self.n, self.eos = prompt_len, n, eos

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        if input_ids.shape[1] - self.prompt_len >= self.n:
            scores = torch.full_like(scores, float("-inf"))
            scores[:, self.eos] = 0.0
        return scores


def test_generate_stops_at_eos(model_dir: Path, tok) -> None:
    model = load_causal_lm(str(model_dir))
    assert model.generation_config.eos_token_id == tok.eos_token_id == 2
    prompt = tok.apply_chat_template(CONVERSATION[:2], add_generation_prompt=True)["input_ids"]
    ids = torch.tensor([prompt])
    out = model.generate(
        ids,
        attention_mask=torch.ones_like(ids),
        max_new_tokens=20,
        do_sample=False,
        logits_processor=LogitsProcessorList([_ForceEosAfter(len(prompt), 3, tok.eos_token_id)]),
    )
    new = out[0, len(prompt):].tolist()
    assert len(new) == 4 and new[-1] == tok.eos_token_id  # stopped right after eos
    assert all(t < len(tok) for t in new)


def test_missing_path_raises_model_error(tmp_path: Path) -> None:
    missing = str(tmp_path / "no-such-model")
    with pytest.raises(ModelError, match="no-such-model"):
        load_causal_lm(missing)
    with pytest.raises(ModelError, match="no-such-model"):
        load_tokenizer(missing)
    with pytest.raises(ModelError, match="config.json"):
        load_causal_lm(str(tmp_path))  # a folder, but not a model
    (tmp_path / "config.json").write_text('{"model_type": "no-such-architecture"}')
    with pytest.raises(ModelError, match=str(tmp_path)) as info:
        load_causal_lm(str(tmp_path))
    assert info.value.__cause__ is not None


def test_unreachable_hub_id_raises_model_error() -> None:
    name = "agentrl-tests/no-such-model-4f1c"
    with pytest.raises(ModelError, match=name):
        load_tokenizer(name)


def test_bad_spec_raises_model_error(tmp_path: Path) -> None:
    with pytest.raises(ModelError, match="head_dim"):
        build_tiny_model(tmp_path / "m", calculator_texts(10), TinyModelSpec(hidden_size=96, num_heads=2))
    assert not (tmp_path / "m").exists()


def test_existing_folder(tmp_path: Path) -> None:
    out = tmp_path / "m"
    out.mkdir()
    build_tiny_model(out, calculator_texts(20))  # an empty folder is fine
    with pytest.raises(ModelError, match="not empty"):
        build_tiny_model(out, calculator_texts(20))
    build_tiny_model(out, calculator_texts(20), TinyModelSpec(seed=3), overwrite=True)
    assert load_causal_lm(str(out)) is not None
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m"]


def test_looks_like_local_path(tmp_path: Path) -> None:
    assert looks_like_local_path(str(tmp_path))
    assert looks_like_local_path("./model") and looks_like_local_path("~/models/x")
    assert looks_like_local_path("/abs/missing") and looks_like_local_path("runs/exp/ckpt")
    assert not looks_like_local_path("Qwen/Qwen2.5-7B-Instruct")
    assert not looks_like_local_path("gpt2")


@pytest.mark.vllm
def test_vllm_loads_tiny_model(tiny_calc_model: Path, tiny_llm) -> None:
    """vLLM serves a model build_tiny_model wrote (the session's tiny calculator model, in the
    session's engine: ``tiny_llm``), and its greedy first token is transformers'."""
    import vllm

    tok = load_tokenizer(str(tiny_calc_model))
    prompt = tok.apply_chat_template(CONVERSATION[:2], add_generation_prompt=True)["input_ids"]
    params = vllm.SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    outputs = tiny_llm.generate([{"prompt_token_ids": prompt}], params, use_tqdm=False)
    token_ids = list(outputs[0].outputs[0].token_ids)
    assert len(token_ids) == 8
    assert all(isinstance(t, int) and 0 <= t < len(tok) for t in token_ids)

    # Greedy vLLM agrees with greedy transformers on the first token.
    model = load_causal_lm(str(tiny_calc_model))
    with torch.no_grad():
        first = model(input_ids=torch.tensor([prompt])).logits[0, -1].argmax().item()
    assert token_ids[0] == first


TOOLS = [{"type": "function", "function": {"name": "python", "parameters": {"type": "object", "properties": {"code": {"type": "string"}}}}}]


def test_chat_template_renders_tools_and_tool_calls_in_hermes_form(tok) -> None:
    call = {"type": "function", "function": {"name": "python", "arguments": {"code": "print(1)"}}}
    messages = [CONVERSATION[0], CONVERSATION[1], {"role": "assistant", "content": None, "tool_calls": [call]}, {"role": "tool", "content": "1"}]
    text = tok.apply_chat_template(messages, tools=TOOLS, tokenize=False, add_generation_prompt=True)
    assert text == (
        "<|im_start|>system\nYou are a calculator.\n<tools>\n"
        '{"name": "python", "parameters": {"type": "object", "properties": {"code": {"type": "string"}}}}\n'
        "</tools><|im_end|>\n"
        "<|im_start|>user\nCompute 123*45+6.<|im_end|>\n"
        '<|im_start|>assistant\n<tool_call>\n{"name": "python", "arguments": {"code": "print(1)"}}\n</tool_call><|im_end|>\n'
        "<|im_start|>tool\n1<|im_end|>\n<|im_start|>assistant\n"
    )
    from agentrl.envs.parsers import HermesParser

    calls = HermesParser().parse(text.split("<|im_start|>assistant\n")[1])
    assert [(c.name, c.arguments, c.error) for c in calls] == [("python", {"code": "print(1)"}, None)]
    # no system message: one is made for the tools; without tools nothing changes
    no_system = tok.apply_chat_template([CONVERSATION[1]], tools=TOOLS, tokenize=False)
    assert no_system.startswith("<|im_start|>system\n<tools>\n")
    assert tok.apply_chat_template(CONVERSATION, tokenize=False) == tok.apply_chat_template(CONVERSATION, tools=None, tokenize=False)
