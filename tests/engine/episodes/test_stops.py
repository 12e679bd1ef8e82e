"""Single-token stop strings become stop token ids: the lookup, and what real vLLM does with them."""

import pytest

from agentrl.engine.episodes.stops import single_token_ids, with_stop_token_ids
from agentrl.models.loading import load_tokenizer


def test_single_token_stops_are_found_and_others_left_out(tiny_calc_model) -> None:
    tok = load_tokenizer(str(tiny_calc_model))
    code_end = tok.encode("</code>", add_special_tokens=False)
    assert len(code_end) == 1  # the tiny tokenizer writes the tool-call end marker as one token
    assert len(tok.encode("\n\n\nThe end", add_special_tokens=False)) > 1
    assert single_token_ids(tok, ["\n\n\nThe end", "</code>", "</code>"]) == code_end
    assert single_token_ids(tok, []) == []


def test_sampling_gets_the_ids_and_keeps_its_strings(tiny_calc_model) -> None:
    tok = load_tokenizer(str(tiny_calc_model))
    (code_end,) = tok.encode("</code>", add_special_tokens=False)
    sampling = {"temperature": 1.0, "stop": ["</code>"], "stop_token_ids": [7]}
    out = with_stop_token_ids(tok, sampling)
    assert out == {"temperature": 1.0, "stop": ["</code>"], "stop_token_ids": [7, code_end]}
    assert sampling["stop_token_ids"] == [7]  # not modified in place
    assert with_stop_token_ids(tok, {"stop": "</code>"})["stop_token_ids"] == [code_end]
    assert with_stop_token_ids(tok, {"temperature": 0.5}) == {"temperature": 0.5}
    assert "stop_token_ids" not in with_stop_token_ids(tok, {"stop": ["no single token here"]})


@pytest.mark.vllm
def test_real_vllm_stops_in_the_step_and_returns_the_same_tokens(tiny_calc_model, tiny_llm) -> None:
    """The id alone: vLLM's scheduler ends the request (stop_reason is the id). The string alone:
    the front end does (stop_reason is the string). Both, as play_episode sends them: the same
    tokens, marker included. Same seed each way. On the session's engine, which is configured as
    agentrl's generators configure theirs (``engine_kwargs``)."""
    import torch

    from agentrl.engine.generation.generator import CPU_BLOCK_SIZE, EngineSettings, engine_kwargs, sampling_params

    tok = load_tokenizer(str(tiny_calc_model))
    (code_end,) = tok.encode("</code>", add_special_tokens=False)
    prompt = tok.encode("Compute 12*34+5.", add_special_tokens=False)
    # an untrained model: restrict sampling to a few tokens so that the marker comes soon
    allowed = [code_end, *tok.encode("x = 12", add_special_tokens=False)]

    if torch.cuda.is_available():  # GPUs keep vLLM's own block size
        assert "block_size" not in engine_kwargs(EngineSettings(model=str(tiny_calc_model)), True)
    else:  # CPU: small blocks, so prefix caching reuses a short episode's turns
        assert tiny_llm.llm_engine.vllm_config.cache_config.block_size == CPU_BLOCK_SIZE

    def generate(sampling: dict):  # with the parameters a generator samples with
        (out,) = tiny_llm.generate([{"prompt_token_ids": prompt}], sampling_params(sampling), use_tqdm=False)
        return out.outputs[0]

    for seed in range(3):
        base = {"temperature": 1.0, "max_tokens": 64, "seed": seed, "stop": ["</code>"], "allowed_token_ids": allowed}
        by_string = generate(base)
        both = generate(with_stop_token_ids(tok, base))
        by_id = generate({**base, "stop": [], "stop_token_ids": [code_end]})
        assert list(both.token_ids) == list(by_string.token_ids) == list(by_id.token_ids)
        assert both.token_ids[-1] == code_end and both.finish_reason == "stop"
        assert tok.decode(both.token_ids, skip_special_tokens=False).endswith("</code>")
        assert (by_id.finish_reason, by_id.stop_reason) == ("stop", code_end)
        assert (by_string.finish_reason, by_string.stop_reason) == ("stop", "</code>")
