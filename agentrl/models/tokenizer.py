"""Byte-level BPE tokenizers with a ChatML chat template, trained from scratch.

The tokenizer mirrors the conventions of Qwen2.5 closely enough that code written against it works
unchanged on a real Qwen model: byte-level BPE (any text round-trips exactly), every digit is its own
token and digits are never merged with anything, ChatML special tokens, and the tool-use tags as
atomic added tokens.
"""

from __future__ import annotations

from collections.abc import Iterable

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from agentrl.errors import ModelError

PAD_TOKEN = "<|endoftext|>"
"""Padding token; also what a document ends with outside chats. Id 0 in trained tokenizers."""
IM_START = "<|im_start|>"
"""Opens a ChatML message (followed by the role and a newline). Id 1 in trained tokenizers."""
IM_END = "<|im_end|>"
"""Closes a ChatML message; the end-of-sequence token for generation. Id 2 in trained tokenizers."""

SPECIAL_TOKENS: tuple[str, ...] = (PAD_TOKEN, IM_START, IM_END)
"""Special tokens, in id order (ids 0, 1, 2). ``skip_special_tokens=True`` drops them."""

TOOL_TOKENS: tuple[str, ...] = (
    "<code>",
    "</code>",
    "<interpreter>",
    "</interpreter>",
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "</tool_response>",
    "<think>",
    "</think>",
)
"""Atomic, non-special added tokens (kept by ``skip_special_tokens=True``); they take the last ids."""

CHAT_TEMPLATE = (
    "{%- if tools %}"
    "{{- '<|im_start|>system\\n' }}"
    "{%- if messages and messages[0]['role'] == 'system' and messages[0]['content'] is string %}"
    "{{- messages[0]['content'] + '\\n' }}"
    "{%- endif %}"
    "{{- '<tools>\\n' }}"
    "{%- for tool in tools %}"
    "{{- (tool['function'] if tool['function'] is defined else tool) | tojson }}{{- '\\n' }}"
    "{%- endfor %}"
    "{{- '</tools><|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message['role'] not in ['system', 'user', 'assistant', 'tool'] %}"
    "{{- raise_exception('Unknown chat role: ' + message['role']) }}"
    "{%- endif %}"
    "{%- if not (tools and loop.first and message['role'] == 'system') %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' }}"
    "{%- if message['content'] is string %}{{- message['content'] }}{%- endif %}"
    "{%- if message['role'] == 'assistant' and message['tool_calls'] is defined and message['tool_calls'] %}"
    "{%- for call in message['tool_calls'] %}"
    "{%- set f = call['function'] if call['function'] is defined else call %}"
    "{%- if message['content'] or not loop.first %}{{- '\\n' }}{%- endif %}"
    "{{- '<tool_call>\\n{\"name\": \"' + f['name'] + '\", \"arguments\": ' }}"
    "{%- if f['arguments'] is string %}{{- f['arguments'] }}{%- else %}{{- f['arguments'] | tojson }}{%- endif %}"
    "{{- '}\\n</tool_call>' }}"
    "{%- endfor %}"
    "{%- endif %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{%- endif %}"
)
"""ChatML as Qwen2.5 renders it, with compact tool support (no default system prompt).

Each message becomes ``<|im_start|>{role}\\n{content}<|im_end|>\\n`` for the roles system, user,
assistant and tool; ``add_generation_prompt=True`` appends ``<|im_start|>assistant\\n``.
With ``tools`` (OpenAI function schemas), the system turn ends with ``<tools>``, one JSON function
schema per line, ``</tools>`` (a system turn is created if the conversation has none). An
assistant message's ``tool_calls`` follow its content, each as
``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`` (Hermes, the format
:class:`agentrl.envs.parsers.HermesParser` reads); tool messages keep the ``tool`` role.
Without tools and tool calls the rendering is the plain ChatML above, unchanged.
Rendering is append-only: a conversation rendered with the generation prompt is a prefix of the
same conversation rendered with the assistant's reply appended.
"""

_MIN_VOCAB = len(SPECIAL_TOKENS) + 256 + len(TOOL_TOKENS)


def train_tokenizer(texts: Iterable[str], *, vocab_size: int = 400) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE tokenizer on ``texts`` and wrap it for transformers.

    ``vocab_size`` is the total size, ``len(tokenizer)``, counting the 3 special tokens, the 256
    byte tokens, the learned merges and the 10 tool tokens; the result may be smaller when the
    texts do not support that many merges. Ids: ``<|endoftext|>`` 0, ``<|im_start|>`` 1,
    ``<|im_end|>`` 2, then bytes and merges, then :data:`TOOL_TOKENS` in order.
    The returned tokenizer has ``eos_token`` ``<|im_end|>``, ``pad_token`` ``<|endoftext|>``, no
    BOS, and :data:`CHAT_TEMPLATE` as its chat template.
    """
    if vocab_size < _MIN_VOCAB:
        raise ModelError(
            f"tokenizer vocab_size={vocab_size} is too small: at least {_MIN_VOCAB} are needed "
            f"(3 special tokens, 256 bytes, {len(TOOL_TOKENS)} tool tokens)"
        )
    tok = Tokenizer(models.BPE())
    # No normalizer: text must round-trip byte for byte.
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - len(TOOL_TOKENS),
        min_frequency=2,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    tok.add_tokens([AddedToken(t, normalized=False, special=False) for t in TOOL_TOKENS])

    hf = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=IM_END,
        pad_token=PAD_TOKEN,
        clean_up_tokenization_spaces=False,
        model_input_names=["input_ids", "attention_mask"],
    )
    hf.add_special_tokens({"additional_special_tokens": [IM_START]})
    hf.chat_template = CHAT_TEMPLATE
    return hf
