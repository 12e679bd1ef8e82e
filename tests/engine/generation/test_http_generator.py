"""The HTTP generator: protocol handling against a scripted transport, and a real `vllm serve`."""

import json
import shutil
import time

import anyio
import httpx
import pytest

from agentrl.engine.generation.http_generator import HttpGenerator
from agentrl.errors import GeneratorError
from tests.e2e.helpers import vllm_server as serve

BACKENDS = ["asyncio", "trio"]


class Server:
    """A scripted vLLM server: records the calls, answers like vLLM 0.32's endpoints."""

    RPC_S = 0.05
    """How long a weight reload (``/collective_rpc``) takes: the stall the client must report."""
    GENERATE_S = 0.03
    """How long one generation takes: the busy time the client must count."""

    def __init__(self, *, rl_endpoints: bool = True, logprobs: int | None = None, extension: bool = True) -> None:
        self.calls: list[tuple[str, str, dict]] = []
        self.extension = extension
        self.rl_endpoints = rl_endpoints
        self.logprobs = logprobs
        self.version = "0"

    def __call__(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content) if request.content else {}
        self.calls.append((request.method, request.url.path, {**body, **dict(request.url.params)}))
        path = request.url.path
        if path == "/health":
            return httpx.Response(200)
        if not self.rl_endpoints and path not in ("/inference/v1/generate",):
            return httpx.Response(404, json={"detail": "Not Found"})
        if path == "/weight_info":
            return httpx.Response(200, json={"weight_version": self.version})
        if path == "/update_weight_version":
            self.version = body["new_version"]
            return httpx.Response(200, json={"success": True})
        if path in ("/pause", "/resume"):
            return httpx.Response(200, json={"status": path[1:]})
        if path == "/collective_rpc":
            if body["method"] != "reload_weights" and not self.extension:
                return httpx.Response(500, json={"error": f"Method {body['method']} not found"})
            time.sleep(self.RPC_S)
            return httpx.Response(200)  # vLLM answers an empty body when the method returns None
        if path == "/inference/v1/generate":
            time.sleep(self.GENERATE_S)
            ids = [7, 8, 9]
            n = len(ids) if self.logprobs is None else self.logprobs
            return httpx.Response(200, json={"choices": [{
                "index": 0, "token_ids": ids, "finish_reason": "stop", "stop_reason": "</code>",
                "logprobs": {"content": [{"token_id": t, "logprob": -0.5} for t in ids[:n]]},
                "weight_versions": [{"version": self.version, "start": 0, "end": 3}],
            }]})
        return httpx.Response(404)


@pytest.mark.parametrize("anyio_backend", BACKENDS)
def test_generate_and_update_weights_protocol(anyio_backend, tmp_path) -> None:
    server = Server()

    async def go():
        g = HttpGenerator("http://vllm:8000/", transport=httpx.MockTransport(server))
        await g.start()
        first = await g.generate([1, 2, 3], {"max_tokens": 3, "temperature": 1.0, "seed": 5})
        stall = await g.update_weights(4, str(tmp_path / "v000004"))
        second = await g.generate([1, 2, 3], {"max_tokens": 3})
        stats = await g.stats()
        await g.shutdown()
        return first, stall, second, stats

    first, stall, second, stats = anyio.run(go, backend=anyio_backend)
    assert (first.token_ids, first.logprobs, first.versions, first.stop_reason) == ([7, 8, 9], [-0.5] * 3, [0, 0, 0], "</code>")
    assert second.versions == [4, 4, 4] and Server.RPC_S <= stall < Server.RPC_S + 5
    assert stats["version"] == 4 and stats["tokens_generated"] == 6
    assert 2 * Server.GENERATE_S <= stats["busy_s"] < 2 * Server.GENERATE_S + 5  # the update is not generation
    gen_body = next(b for m, p, b in server.calls if p == "/inference/v1/generate")
    assert gen_body["token_ids"] == [1, 2, 3]
    assert gen_body["sampling_params"]["seed"] == 5 and gen_body["sampling_params"]["logprobs"] == 0
    assert gen_body["sampling_params"]["include_stop_str_in_output"] is True
    update = [(p, b) for m, p, b in server.calls if p in ("/pause", "/collective_rpc", "/update_weight_version", "/resume")]
    assert [p for p, _ in update][-4:] == ["/pause", "/collective_rpc", "/update_weight_version", "/resume"]
    assert update[-4][1]["mode"] == "keep"
    assert update[-3][1] == {"method": "reload_weights", "kwargs": {"weights_path": str((tmp_path / "v000004").resolve())}}


def test_server_without_rl_endpoints_is_a_clear_error() -> None:
    g = HttpGenerator("http://vllm:8000", transport=httpx.MockTransport(Server(rl_endpoints=False)))
    with pytest.raises(GeneratorError, match="VLLM_SERVER_DEV_MODE=1"):
        anyio.run(g.start)


def test_unreachable_server_and_bad_answers() -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    with pytest.raises(GeneratorError, match="does not answer"):
        anyio.run(HttpGenerator("http://nowhere:1", transport=httpx.MockTransport(refuse)).start)

    async def mismatch():
        g = HttpGenerator("http://vllm:8000", transport=httpx.MockTransport(Server(logprobs=2)))
        await g.start()
        await g.generate([1], {"max_tokens": 3})

    with pytest.raises(GeneratorError, match="3 tokens but 2 logprobs"):
        anyio.run(mismatch)
    with pytest.raises(GeneratorError, match="not started"):
        anyio.run(HttpGenerator("http://vllm:8000").generate, [1], {})


def _tie(folder) -> None:
    """Make the Hugging Face folder's model tie its output projection to its input embedding (as
    SmolLM2 and Qwen2.5 up to 3B do): ``tie_word_embeddings`` on, no ``lm_head.weight`` stored."""
    from safetensors.torch import load_file, save_file

    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "tie_word_embeddings": True}))
    sd = load_file(str(folder / "model.safetensors"))
    del sd["lm_head.weight"]
    save_file(sd, str(folder / "model.safetensors"), metadata={"format": "pt"})


def _hf_logprobs(folder, prompt: list[int], ids: list[int]) -> list[float]:
    """The log-probs of ``ids`` after ``prompt`` under the weights in ``folder``, computed with plain
    transformers (float32, temperature 1: what a server with processed log-probs reports)."""
    import torch
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()
    with torch.no_grad():
        lp = torch.log_softmax(hf(torch.tensor([prompt + ids])).logits[0].float(), -1)
    return [lp[len(prompt) - 1 + i, t].item() for i, t in enumerate(ids)]


@pytest.fixture(scope="module")
def tied_model(tiny_calc_model, tmp_path_factory):
    """The tiny model with tied embeddings (its own is untied): the case a reload alone gets wrong."""
    folder = tmp_path_factory.mktemp("tied") / "tiny-calc-tied"
    shutil.copytree(tiny_calc_model, folder)
    _tie(folder)
    return folder


MAX_LEN = 4096
"""The server's context: room for a request long enough to still be decoding when the update's
pause lands (the 400 tokens this test used to ask for once finished before a
0.3 s sleep and the pause that followed it had landed, under CI's load)."""
LONG = 2000
"""Tokens of the request kept in flight across the update (seconds of decoding here: margin for a
pause that a loaded machine delays)."""
ATTEMPTS = 3
"""Long requests tried before the test gives up on seeing one decoding (each is tried again only
when it finished before it was seen; the update is sent once, to the first seen decoding)."""


async def _scheduler(client: httpx.AsyncClient) -> dict[str, float]:
    """How many requests the server (``client``'s base URL) is decoding (``running``) and holds
    back (``waiting``) now: its Prometheus ``vllm:num_requests_running`` and
    ``vllm:num_requests_waiting``."""
    answer = await client.get("/metrics")
    answer.raise_for_status()
    counts = {"running": 0.0, "waiting": 0.0}
    for line in answer.text.splitlines():
        for key in counts:
            if line.startswith(f"vllm:num_requests_{key}"):
                counts[key] += float(line.rsplit(" ", 1)[1])
    return counts


@pytest.fixture(scope="module")
def vllm_server(tied_model, tmp_path_factory):
    """`vllm serve` of the tied tiny model with the RL and token-in/token-out endpoints and
    agentrl's worker extension (the re-tie after each reload) on, in float32 (the server's
    ``auto`` dtype is bfloat16 on these CPUs), its engine on one core: its URL and its log file."""
    from agentrl.engine.generation.vllm_worker import WORKER_EXTENSION

    log_path = tmp_path_factory.mktemp("vllm-serve") / "server.log"
    with serve(
        tied_model, log_path, "--dtype", "float32", "--max-model-len", str(MAX_LEN), "--enable-scale-out", "--logprobs-mode", "processed_logprobs", "--seed", "0",
        "--no-enable-chunked-prefill", "--max-num-batched-tokens", "4096", "--worker-extension-cls", WORKER_EXTENSION,
        # its engine's threads on one core: the other stays free for the server's own process and
        # this test's looks at /metrics (in CI of 2026-12-02, with the engine on both cores, a look
        # was answered only after a 2,000-token request had finished; starvation is the likely
        # cause, not a shown one)
        env={"VLLM_SERVER_DEV_MODE": "1", "VLLM_LOGGING_LEVEL": "WARNING", "VLLM_CPU_OMP_THREADS_BIND": "0"},
    ) as url:
        yield url, log_path


TOL = 1e-4
"""|log-prob| difference between the server and plain transformers on the same weights (float32)."""


@pytest.mark.vllm
def test_real_vllm_serve_tokens_versions_and_inflight_update(vllm_server, tied_model, tmp_path) -> None:
    """Against a real server of a tied-embedding model: tokens, log-probs and versions come back;
    a request survives an update; after the update the new weights sample, output projection
    included (re-tied to the new embedding: without it the server samples from the old one)."""
    import torch
    from safetensors.torch import load_file, save_file

    from agentrl.models.loading import load_tokenizer

    # version 1: the same model with every weight (the shared embedding too) nudged
    v1 = tmp_path / "v000001"
    shutil.copytree(tied_model, v1)
    sd = load_file(str(v1 / "model.safetensors"))
    assert "lm_head.weight" not in sd
    gen = torch.Generator().manual_seed(0)
    save_file({k: t + 0.05 * torch.randn(t.shape, generator=gen) for k, t in sd.items()}, str(v1 / "model.safetensors"), metadata={"format": "pt"})
    tok = load_tokenizer(str(tied_model))
    text = tok.apply_chat_template([{"role": "user", "content": "Compute 12*34+5."}], add_generation_prompt=True, tokenize=False)
    prompt = tok.encode(text, add_special_tokens=False)
    sampling = {"max_tokens": 12, "temperature": 1.0, "seed": 3, "ignore_eos": True}

    url, log_path = vllm_server

    async def go():
        g = HttpGenerator(url, timeout_s=120)
        info = await g.start()
        a = await g.generate(prompt, sampling)
        again = await g.generate(prompt, sampling)
        # a request in flight while the weights change: the update goes out as soon as the server
        # decodes it, not after a guessed sleep; one that finished before it was seen decoding (a
        # fast machine, a starved poll) is tried again, the update not yet sent
        looks: list[list[tuple[float, dict[str, float]]]] = []
        for _ in range(ATTEMPTS):
            long: list = []
            seen: list[tuple[float, dict[str, float]]] = []
            looks.append(seen)
            stall = wall = None
            async with httpx.AsyncClient(base_url=url, timeout=30) as poll, anyio.create_task_group() as tg:
                async def long_request() -> None:
                    long.append(await g.generate(prompt, {"max_tokens": LONG, "temperature": 1.0, "seed": 4, "ignore_eos": True}))

                tg.start_soon(long_request)
                t_start = time.monotonic()
                while not long and time.monotonic() - t_start < 60:
                    seen.append((round(time.monotonic() - t_start, 2), await _scheduler(poll)))
                    if seen[-1][1]["running"] and not long:
                        t0 = time.monotonic()
                        stall = await g.update_weights(1, str(v1))
                        wall = time.monotonic() - t0
                        break
                    await anyio.sleep(0.01)
                if stall is None and not long:  # not decoding after 60 s: no wait for it to end
                    tg.cancel_scope.cancel()
            if stall is not None:
                break
            if not long:  # said outside the task group, whose exception group would hide it
                pytest.fail(f"the long request was not being decoded after 60 s; the server's scheduler at each look: "
                            f"{seen[:5]} ... {seen[-5:]}\nthe server's log:\n{log_path.read_text()[-3000:]}")
        else:
            pytest.fail(f"each of {ATTEMPTS} long requests finished before the server was seen decoding it; "
                        f"the looks of each: {[(s[:3], s[-3:]) for s in looks]}\nthe server's log:\n{log_path.read_text()[-3000:]}")
        print(f"the long request seen decoding at look {len(looks[-1])} ({looks[-1][-1][0]} s) of attempt {len(looks)}")
        b = await g.generate(prompt, sampling)
        stats = await g.stats()
        await g.shutdown()
        return info, a, again, stall, wall, b, long[0], stats

    info, a, again, stall, wall, b, spanning, stats = anyio.run(go)
    # the long request survived the update (pause mode "keep"): version 0 tokens, then version 1
    assert len(spanning.token_ids) == LONG and spanning.versions[0] == 0 and spanning.versions[-1] == 1
    assert spanning.versions == sorted(spanning.versions)
    assert info["device"] == "remote"
    assert len(a.token_ids) == len(a.logprobs) == 12 and a.versions == [0] * 12
    assert (again.token_ids, again.logprobs) == (a.token_ids, a.logprobs)  # seeded: reproducible
    # the stall is the update's own time, as measured around the call
    assert stats["update_stalls_s"] == [stall] and 0 < stall <= wall
    assert b.versions == [1] * 12
    # the log-probs are those of the weights each version names: the server's version 0 is the
    # model, its version 1 the new folder, both as plain transformers computes them
    before = _hf_logprobs(tied_model, prompt, a.token_ids)
    after = _hf_logprobs(v1, prompt, b.token_ids)
    errs = (max(abs(x - y) for x, y in zip(before, a.logprobs)), max(abs(x - y) for x, y in zip(after, b.logprobs)))
    print(f"server vs transformers, max |dlogp|: version 0 {errs[0]:.3g}, version 1 {errs[1]:.3g}")
    assert errs[0] < TOL and errs[1] < TOL
    # and the two versions differ on these tokens, so the check above tells them apart
    assert max(abs(x - y) for x, y in zip(_hf_logprobs(tied_model, prompt, b.token_ids), b.logprobs)) > 100 * TOL


@pytest.mark.parametrize("extension", [True, False])
def test_a_tied_model_is_retied_after_a_reload(tmp_path, extension: bool) -> None:
    """A version of a tied-embedding model: after reload_weights the server re-ties lm_head
    (agentrl's worker method); a server started without agentrl's worker extension is reported
    with what to add to its command line."""
    from agentrl.engine.generation.vllm_worker import RETIE_METHOD, WORKER_EXTENSION

    server = Server(extension=extension)
    (tmp_path / "v1").mkdir()
    (tmp_path / "v1" / "config.json").write_text(json.dumps({"model_type": "llama", "tie_word_embeddings": True}))
    (tmp_path / "v2").mkdir()
    (tmp_path / "v2" / "config.json").write_text(json.dumps({"model_type": "qwen2", "tie_word_embeddings": False}))

    async def go():
        g = HttpGenerator("http://vllm:8000", transport=httpx.MockTransport(server))
        await g.start()
        try:
            await g.update_weights(2, str(tmp_path / "v2"))  # untied: nothing more to do
            await g.update_weights(1, str(tmp_path / "v1"))
        finally:
            await g.shutdown()

    if extension:
        anyio.run(go)
    else:
        with pytest.raises(GeneratorError, match=f"--worker-extension-cls {WORKER_EXTENSION}"):
            anyio.run(go)
    rpcs = [b["method"] for m, p, b in server.calls if p == "/collective_rpc"]
    assert rpcs == ["reload_weights", "reload_weights", RETIE_METHOD]
    assert [p for m, p, b in server.calls][-1] == "/resume"  # generation resumes either way
