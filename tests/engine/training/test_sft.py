"""SFT data: conversations (plain or with tools) to tokens and loss masks, and where they come from."""

from __future__ import annotations

import json

import pytest

from agentrl.agents import PYTHON_TOOL
from agentrl.engine.training.sft import encode_chat, load_conversations
from agentrl.envs.calc import sample_texts
from agentrl.errors import DataError
from agentrl.models.tokenizer import train_tokenizer


@pytest.fixture(scope="module")
def tok():
    return train_tokenizer(sample_texts(200, 0), vocab_size=400)


def trained_text(tok, enc) -> list[str]:
    """The decoded runs of loss-mask-1 tokens."""
    runs, cur = [], []
    for t, m in zip(enc["tokens"], enc["loss_mask"]):
        if m:
            cur.append(t)
        elif cur:
            runs.append(tok.decode(cur, skip_special_tokens=False))
            cur = []
    return runs + ([tok.decode(cur, skip_special_tokens=False)] if cur else [])


def test_only_the_assistant_turns_and_their_end_token_are_trained(tok):
    conv = [{"role": "user", "content": "Compute 1+2."}, {"role": "assistant", "content": "\\boxed{3}"}]
    enc = encode_chat(tok, conv)
    assert tok.decode(enc["tokens"], skip_special_tokens=False) == tok.apply_chat_template(conv, tokenize=False)
    assert trained_text(tok, enc) == ["\\boxed{3}<|im_end|>"]


def test_a_conversation_with_tools_renders_them_and_trains_the_tool_calls(tok):
    call = {"type": "function", "function": {"name": "python", "arguments": {"code": "print(1+2)"}}}
    conv = {"messages": [{"role": "user", "content": "Compute 1+2."}, {"role": "assistant", "content": None, "tool_calls": [call]},
                         {"role": "tool", "content": "3"}, {"role": "assistant", "content": "\\boxed{3}"}], "tools": [PYTHON_TOOL]}
    enc = encode_chat(tok, conv)
    assert tok.decode(enc["tokens"], skip_special_tokens=False) == tok.apply_chat_template(conv["messages"], tools=[PYTHON_TOOL], tokenize=False)
    assert trained_text(tok, enc) == ['<tool_call>\n{"name": "python", "arguments": {"code": "print(1+2)"}}\n</tool_call><|im_end|>',
                                      "\\boxed{3}<|im_end|>"]
    assert "<tools>" in tok.decode(enc["tokens"][: enc["loss_mask"].index(1)])


def test_files_with_tools_and_their_errors(tmp_path):
    good = tmp_path / "good.jsonl"
    rows = [{"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}], "tools": [PYTHON_TOOL]},
            {"messages": [{"role": "user", "content": "c"}, {"role": "assistant", "content": "d"}]}]
    good.write_text("\n".join(json.dumps(r) for r in rows))
    convs = load_conversations(str(good), 3)
    assert convs[0] == rows[0] and convs[1] == rows[1]["messages"] and convs[2] == rows[0]
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"messages": rows[0]["messages"], "tools": "python"}))
    with pytest.raises(DataError, match=r"row 1 \(line 1\): has a 'tools' field"):
        load_conversations(str(bad), 1)
    assert len(load_conversations("agentrl.envs.calc_agent:demonstrations", 5)) == 5


def test_a_broken_json_line_names_the_file_and_its_1_based_line(tmp_path):
    chat = {"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]}
    broken = tmp_path / "demos.jsonl"
    broken.write_text(json.dumps(chat) + "\n\n" + '{"messages": [oops]}\n')
    with pytest.raises(DataError) as info:
        load_conversations(str(broken), 1)
    assert str(info.value).startswith(f"{broken}: line 3: not valid JSON")


def test_a_bad_row_is_named_1_based_with_its_line_as_the_rl_data_loader_does(tmp_path):
    chat = {"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]}
    lines = tmp_path / "demos.jsonl"
    lines.write_text(json.dumps(chat) + "\n\n" + json.dumps({"text": "no messages"}) + "\n")
    with pytest.raises(DataError) as info:
        load_conversations(str(lines), 1)
    assert str(info.value) == f"{lines}: row 2 (line 3): has no 'messages' list of {{role, content}} objects"
    whole = tmp_path / "demos.json"
    whole.write_text(json.dumps([chat, chat, {"messages": "hi"}], indent=1))
    with pytest.raises(DataError) as info:
        load_conversations(str(whole), 1)
    assert str(info.value).startswith(f"{whole}: row 3: has no 'messages' list")
