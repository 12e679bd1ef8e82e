"""Stop strings that are single tokens, also given to vLLM as stop token ids.

vLLM checks ``stop`` strings in its front end, on detokenised text: when a turn ends with
``</code>``, the engine core has already scheduled the request for another step or two before
the abort reaches it. Those steps compute tokens nobody reads, and the slot stays taken. A stop
*token id* is checked by the scheduler in the step that samples it.

Tool-call end markers are often single tokens (``</tool_call>`` in Qwen2.5/Qwen3 tokenizers,
``</code>`` in the tiny model's). :func:`with_stop_token_ids` adds such markers to
``stop_token_ids`` and keeps them in ``stop``: the string check still catches the same marker
spelled with several tokens, so what ends a turn does not change, only how early the engine
learns it. Nothing the model wrote is re-tokenised: only the stop strings are encoded, once per
episode (microseconds, beside a turn's generation).
"""

from __future__ import annotations

from typing import Any

__all__ = ["single_token_ids", "with_stop_token_ids"]


def single_token_ids(tokenizer: Any, stops: list[str] | tuple[str, ...]) -> list[int]:
    """Ids of the stop strings that the tokenizer writes as exactly one token which decodes back
    to exactly that string (in the order of ``stops``; the others are left out)."""
    ids: list[int] = []
    for s in stops:
        enc = tokenizer.encode(s, add_special_tokens=False)
        if len(enc) == 1 and tokenizer.decode(enc, skip_special_tokens=False) == s and enc[0] not in ids:
            ids.append(int(enc[0]))
    return ids


def with_stop_token_ids(
    tokenizer: Any, sampling: dict[str, Any], cache: dict[tuple[str, ...], list[int]] | None = None
) -> dict[str, Any]:
    """``sampling`` (``SamplingParams`` keyword arguments) with its single-token ``stop``
    strings added to ``stop_token_ids`` (a new dict; ``sampling`` itself is not changed).
    ``cache`` (one per tokenizer) keeps the ids of each list of stop strings already seen."""
    stops = sampling.get("stop") or []
    if isinstance(stops, str):
        stops = [stops]
    key = tuple(stops)
    if cache is not None and key in cache:
        ids = cache[key]
    else:
        ids = single_token_ids(tokenizer, list(stops))
        if cache is not None:
            cache[key] = ids
    if not ids:
        return dict(sampling)
    have = list(sampling.get("stop_token_ids") or [])
    return {**sampling, "stop_token_ids": have + [i for i in ids if i not in have]}
