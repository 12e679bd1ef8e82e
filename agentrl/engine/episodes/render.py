"""Incremental chat rendering for token-in/token-out multi-turn episodes.

The generator's output ids are never re-tokenised. Between turns, only the *template glue*
(end of the assistant turn, the environment's messages, the next assistant header) is rendered
with the model's chat template and tokenised, then appended with loss mask 0.

The glue is found by rendering the conversation with the new messages and checking that it
starts with exactly what the model has already seen (previous rendering + generated text).
Templates that rewrite earlier turns (e.g. dropping past reasoning) break that property; this is
detected and reported as :class:`TemplateMismatch` instead of training on a token sequence the
generator never saw.
"""

from __future__ import annotations

from typing import Any

from agentrl.errors import EnvError

Message = dict[str, Any]


class TemplateMismatch(EnvError):
    """The chat template is not append-only for this conversation."""


def special_tokens(tokenizer: Any) -> list[str]:
    """The tokenizer's special tokens as text, longest first (for :func:`strip_special_suffix`)."""
    return sorted((t for t in getattr(tokenizer, "all_special_tokens", []) if t), key=len, reverse=True)


def strip_special_suffix(text: str, specials: list[str]) -> str:
    """The assistant message content of a turn: ``text`` without the special tokens (EOS...) it
    ends with, ``specials`` as :func:`special_tokens` gives them."""
    changed = True
    while changed:
        changed = False
        for tok in specials:
            if tok and text.endswith(tok):
                text, changed = text[: -len(tok)], True
    return text


class IncrementalRenderer:
    """Keeps the rendered text of one conversation and yields the token ids to append."""

    def __init__(self, tokenizer: Any, messages: list[Message]) -> None:
        self.tokenizer = tokenizer
        self.messages: list[Message] = list(messages)
        self.text = self._render(self.messages)
        self._special = special_tokens(tokenizer)

    def _render(self, messages: list[Message]) -> str:
        return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)

    def _encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def prompt_ids(self) -> list[int]:
        """Token ids of the initial prompt (system/user messages plus the assistant header)."""
        return self._encode(self.text)

    def strip_special_suffix(self, text: str) -> str:
        """The assistant message content of a turn: ``text`` without trailing special tokens (EOS)."""
        return strip_special_suffix(text, self._special)

    def append_turn(self, generated_text: str, observation: list[Message]) -> list[int]:
        """Record the model's turn (decoded exactly from its ids, special tokens kept) and the
        environment's new messages; return the glue ids that lead to the next assistant turn."""
        messages = self.messages + [
            {"role": "assistant", "content": self.strip_special_suffix(generated_text)},
            *observation,
        ]
        new_text = self._render(messages)
        seen = self.text + generated_text
        if not new_text.startswith(seen):
            at = next((i for i, (a, b) in enumerate(zip(new_text, seen)) if a != b), min(len(new_text), len(seen)))
            raise TemplateMismatch(
                "chat template is not append-only: re-rendering the conversation changes text the "
                f"model already saw at character {at} ({seen[at:at + 40]!r} -> {new_text[at:at + 40]!r})"
            )
        self.messages = messages
        self.text = new_text
        return self._encode(new_text[len(seen):])
