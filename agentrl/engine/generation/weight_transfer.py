"""Weight sync over a collective: the learner broadcasts each version straight into the
generators' vLLM workers through vLLM's weight-transfer engine API.

Backends (``[generator] weight_sync``):

* ``nccl`` — vLLM's own NCCL engine (GPU learner and GPU generators on different devices);
* ``gloo`` — the same protocol over a torch ``gloo`` group (CPU, or any machine without NCCL),
  implemented here as a vLLM weight-transfer engine and registered with vLLM as a general plugin
  (the ``vllm.general_plugins`` entry point ``agentrl``), so that vLLM's worker processes find it;
* ``ipc`` — vLLM's CUDA IPC engine (colocated placement on GPUs: learner rank i and generator i
  share GPU i). Every learner rank gathers each full parameter on its own GPU into a packed
  staging buffer and shares it by a CUDA IPC handle; rank 0 sends the handles of every rank, and
  the vLLM worker on each GPU maps its own GPU's buffer and loads from it. Nothing crosses the
  host or a disk, and no process group joins the generators.

The round trip is vLLM's: trainer rank 0 drives the inference side through a *client*
(``start_weight_update`` → ``update_weights`` while it broadcasts → ``finish_weight_update``).
Here the client is :class:`GeneratorClient`, which calls the generator actors; each generator
pauses generation with mode ``keep`` around the update, so requests in flight survive it and their
tokens carry both versions. Every collective and every call has a timeout; a failure raises
:class:`~agentrl.errors.WeightSyncError`, it never hangs.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, ClassVar

import torch

__all__ = [
    "ABORT_GRACE_S",
    "BACKENDS",
    "GeneratorClient",
    "LocalGeneratorClient",
    "model_source",
    "free_endpoint",
    "rank_offsets",
    "run_bounded",
    "register",
    "send_wait_s",
    "send_watchdog_s",
    "trainer_connect",
]

BACKENDS = ("nccl", "gloo", "ipc")
"""Direct weight-sync backends a recipe may name (``disk`` is the default, not a transfer group)."""

def ipc_buffer_bytes(param_bytes: list[int]) -> int:
    """The IPC staging buffer for parameters of ``param_bytes`` bytes each (in the wire dtype):
    :data:`~agentrl.placement_plan.IPC_BUFFER_BYTES` (what the memory plan counts), or the largest
    parameter when that is larger (vLLM's packed producer cannot split a tensor across chunks)."""
    from agentrl.placement_plan import IPC_BUFFER_BYTES

    return max([IPC_BUFFER_BYTES, *param_bytes])


def ipc_transport_safe(update_info: dict[str, Any]) -> dict[str, Any]:
    """``update_info`` with its CUDA IPC handles (tuples holding classes, dtypes and bytes,
    which vLLM's msgpack channel to its engine process does not carry) pickled into
    ``ipc_handles_pickled``, the field vLLM's worker decodes (it needs
    ``VLLM_ALLOW_INSECURE_SERIALIZATION=1``, set for engines started with ``ipc``). Other
    backends' update infos are returned unchanged."""
    handles = update_info.get("ipc_handles")
    if handles is None:
        return update_info
    import base64
    import pickle

    out = {k: v for k, v in update_info.items() if k != "ipc_handles"}
    out["ipc_handles_pickled"] = base64.b64encode(pickle.dumps(handles)).decode("ascii")
    return out


def free_endpoint() -> tuple[str, int]:
    """This node's address and a free TCP port, for the transfer group's rendezvous."""
    try:
        import ray

        address = ray.util.get_node_ip_address()
    except Exception:
        address = "127.0.0.1"
    with socket.socket() as s:
        s.bind(("", 0))
        return address, int(s.getsockname()[1])


# ---------------------------------------------------------------------------------------------
# the weights to send
# ---------------------------------------------------------------------------------------------


def _clean_name(name: str) -> str:
    """A parameter name as the Hugging Face checkpoint spells it (no wrapper prefixes)."""
    for wrapper in ("_checkpoint_wrapped_module.", "_fsdp_wrapped_module.", "_orig_mod."):
        name = name.replace(wrapper, "")
    return name


def model_source(module: torch.nn.Module, wire_dtype: torch.dtype) -> Any:
    """The learner's parameters as a vLLM ``WeightSource``: Hugging Face names, full tensors
    (FSDP shards are gathered with ``full_tensor()``, a collective every learner rank runs in the
    same order) in ``wire_dtype`` (the generators' dtype, the recipe's ``model.dtype``). Each
    rank casts its own shard before the gather: a bfloat16 version moves half the bytes of the
    float32 master weights through the gather and never holds a float32 full tensor."""
    return _classes()["source"](module, wire_dtype)


# ---------------------------------------------------------------------------------------------
# the inference side, as seen from trainer rank 0
# ---------------------------------------------------------------------------------------------


ABORT_GRACE_S = 5.0
"""After a bounded call's abort, how long :func:`run_bounded` waits for the call to return."""

SEND_COLLECTIVE_TIMEOUTS = 4
"""A whole update (one send) is bounded by this many collective timeouts: it may take several
(one per packed chunk), plus the generators' own calls."""


def send_watchdog_s(timeout_s: float) -> float:
    """The learner's bound on one whole send of a version when each collective and generator
    call is bounded by ``timeout_s`` (``generator.weight_sync_timeout_s``): past it the learner's
    watchdog aborts the transfer group and reports the failure."""
    return SEND_COLLECTIVE_TIMEOUTS * timeout_s


def send_wait_s(timeout_s: float) -> float:
    """How long the controller waits for the learner's send of one version: longer than the
    learner's own watchdog (:func:`send_watchdog_s`) plus the abort's grace and the call's round
    trip, so that a stuck send always ends (aborted, reported by the learner) before the
    controller gives up on it. Waiting less would start the disk fallback's collectives (the
    gather of the weights) beside a send still blocked in its broadcast."""
    return send_watchdog_s(timeout_s) + ABORT_GRACE_S + 30.0


def run_bounded(fn: Any, timeout_s: float, abort: Any, what: str) -> Any:
    """Run ``fn()`` in a helper thread and return its result, waiting at most ``timeout_s``.

    NCCL collectives have no timeout of their own: a broadcast whose peer died blocks forever.
    On timeout ``abort()`` is called (it should tear the communicator down, e.g. vLLM's
    ``PyNcclCommunicator.destroy`` aborts it, which releases the blocked call) and
    :class:`~agentrl.errors.WeightSyncError` is raised naming ``what``; an exception of ``fn``
    is raised here unchanged.
    """
    import threading

    from agentrl.errors import WeightSyncError

    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["result"] = fn()
        except BaseException as exc:  # re-raised in the caller's thread
            box["error"] = exc

    thread = threading.Thread(target=target, name=f"bounded: {what}", daemon=True)
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        try:
            abort()
        finally:
            thread.join(ABORT_GRACE_S)  # an abort that worked lets the call return; never wait for it long
        raise WeightSyncError(f"{what} did not finish within {timeout_s:.0f} s; the transfer group was aborted")
    if "error" in box:
        raise box["error"]
    return box.get("result")


def rank_offsets(world_size: int, generators: int) -> list[int]:
    """The first rank of each generator's vLLM workers in a weight-transfer group of
    ``world_size`` ranks: rank 0 is the trainer, then ``(world_size - 1) / generators`` ranks
    (the tensor-parallel size) per generator, so generator ``i`` starts at ``1 + i * tp``.

    Raises:
        WeightSyncError: the workers do not divide evenly among the generators.
    """
    from agentrl.errors import WeightSyncError

    workers = world_size - 1
    if generators < 1 or workers < generators or workers % generators:
        raise WeightSyncError(f"a weight-transfer group of {world_size} ranks cannot hold the trainer and {generators} equal generators")
    per = workers // generators
    return [1 + i * per for i in range(generators)]


class GeneratorClient:
    """vLLM's ``VLLMWeightSyncClient`` protocol over agentrl generator actors (Ray handles).

    Each call fans out to every generator and waits for all of them, at most ``timeout_s``.
    ``version`` is the label the generators give the weights at ``finish_weight_update``.
    """

    def __init__(self, generators: list[Any], timeout_s: float) -> None:
        self.generators = list(generators)
        self.timeout_s = timeout_s
        self.version: int | None = None

    def _all(self, method: str, *args: Any, per_generator: list[tuple[Any, ...]] | None = None) -> list[Any]:
        """Call ``method`` on every generator with ``args`` (or generator ``i`` with
        ``per_generator[i]``) and wait for all of them."""
        import ray

        from agentrl.errors import WeightSyncError

        arglists = per_generator if per_generator is not None else [args] * len(self.generators)
        refs = [getattr(g, method).remote(*a) for g, a in zip(self.generators, arglists)]
        try:
            return ray.get(refs, timeout=self.timeout_s)
        except ray.exceptions.GetTimeoutError:
            raise WeightSyncError(f"generators did not finish {method} within {self.timeout_s} s") from None
        except Exception as exc:
            raise WeightSyncError(f"generator {method} failed: {type(exc).__name__}: {exc}") from exc

    def init_weight_transfer_engine(self, init_info: dict[str, Any]) -> None:
        """Each generator joins with its own ``rank_offset`` (:func:`rank_offsets`): the group's
        ranks are the trainer's 0, then every generator's vLLM workers in turn. Without a
        ``world_size`` (``ipc``: no group to join, only wire settings) every generator gets
        ``init_info`` as it is."""
        if "world_size" not in init_info:
            self._all("init_weight_transfer", init_info)
            return
        offsets = rank_offsets(int(init_info["world_size"]), len(self.generators))
        self._all("init_weight_transfer", per_generator=[({**init_info, "rank_offset": o},) for o in offsets])

    def shutdown_weight_transfer_engine(self) -> None:
        self._all("shutdown_weight_transfer")

    def start_weight_update(self) -> None:
        self._all("begin_weight_update")

    def update_weights(self, update_info: Any) -> None:
        self._all("receive_weights", update_info)

    def finish_weight_update(self, weight_version: str | None = None) -> None:
        version = self.version if weight_version is None else int(weight_version)
        if version is None:
            raise ValueError("GeneratorClient.version must be set before a weight update")
        self._all("end_weight_update", version)


class LocalGeneratorClient(GeneratorClient):
    """The same client over an in-process :class:`~agentrl.engine.generation.generator.VllmGenerator` whose
    event loop is ``loop`` (the trainer side runs in another thread): benchmarks and tests."""

    def __init__(self, generator: Any, loop: Any, timeout_s: float) -> None:
        super().__init__([generator], timeout_s)
        self.loop = loop

    def _all(self, method: str, *args: Any, per_generator: list[tuple[Any, ...]] | None = None) -> list[Any]:
        import asyncio

        from agentrl.errors import WeightSyncError

        if per_generator is not None:
            (args,) = per_generator
        future = asyncio.run_coroutine_threadsafe(getattr(self.generators[0], method)(*args), self.loop)
        try:
            return [future.result(self.timeout_s)]
        except TimeoutError:
            future.cancel()
            raise WeightSyncError(f"generator did not finish {method} within {self.timeout_s} s") from None


# ---------------------------------------------------------------------------------------------
# gloo: a vLLM weight-transfer engine over a torch gloo group
# ---------------------------------------------------------------------------------------------


def _gloo_group(address: str, port: int, rank: int, world_size: int, timeout_s: float) -> Any:
    from vllm.distributed.utils import stateless_init_torch_distributed_process_group

    return stateless_init_torch_distributed_process_group(
        address, port, rank, world_size, "gloo", timeout=timedelta(seconds=timeout_s)
    )


def _broadcast(group: Any, tensor: torch.Tensor, timeout_s: float) -> None:
    """Broadcast ``tensor`` from group rank 0 (in place on the other ranks), bounded in time."""
    from torch.distributed import BroadcastOptions

    opts = BroadcastOptions()
    opts.rootRank = 0
    opts.rootTensor = 0
    opts.timeout = timedelta(seconds=timeout_s)
    group.broadcast([tensor], opts).wait(timedelta(seconds=timeout_s))


def _on_host(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` in host memory (a copy when it is on a GPU): what a CPU gloo group can send."""
    return tensor if tensor.device.type == "cpu" else tensor.to("cpu")


CHUNK_BYTES = 256 * 2**20
"""Parameters travel packed: consecutive ones of one dtype, concatenated up to this many bytes
(one broadcast each instead of one per parameter)."""


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n


def _chunks(metas: list[tuple[str, torch.dtype, tuple[int, ...]]]) -> list[list[tuple[str, torch.dtype, tuple[int, ...]]]]:
    """Split ``(name, dtype, shape)`` in order into runs of one dtype of at most ``CHUNK_BYTES``
    (a parameter larger than that travels alone). Sender and receivers cut the same way."""
    out: list[list[tuple[str, torch.dtype, tuple[int, ...]]]] = []
    size = 0
    for m in metas:
        nbytes = _numel(m[2]) * torch.empty((), dtype=m[1]).element_size()
        if not out or out[-1][0][1] != m[1] or size + nbytes > CHUNK_BYTES:
            out.append([])
            size = 0
        out[-1].append(m)
        size += nbytes
    return out


def _classes() -> dict[str, type]:
    """The gloo engine classes, built on first use (they subclass vLLM's, imported lazily)."""
    if _CLASSES:
        return _CLASSES
    from vllm.distributed.weight_transfer.base import (
        ParamMeta,
        WeightSource,
        WeightTransferInitInfo,
        materialize_full_tensor,
    )
    from vllm.distributed.weight_transfer.nccl_engine import (
        NCCLTrainerInitInfo,
        NCCLTrainerWeightTransferEngine,
        NCCLWeightTransferEngine,
        NCCLWeightTransferUpdateInfo,
    )

    class ModelSource(WeightSource):  # type: ignore[misc, valid-type]
        def __init__(self, module: torch.nn.Module, wire_dtype: torch.dtype) -> None:
            self.module = module
            self.wire_dtype = wire_dtype

        def metadata(self) -> list[Any]:
            return [ParamMeta(_clean_name(n), self.wire_dtype, tuple(p.shape)) for n, p in self.module.named_parameters()]

        def __iter__(self) -> Iterator[tuple[str, torch.Tensor]]:
            for n, p in self.module.named_parameters():
                # cast the shard, then gather (a DTensor casts shard by shard, no collective)
                yield _clean_name(n), materialize_full_tensor(p.detach().to(self.wire_dtype)).contiguous()

    @dataclass
    class GlooWeightTransferInitInfo(WeightTransferInitInfo):
        """Where the trainer's gloo group meets (worker side)."""

        master_address: str
        master_port: int
        rank_offset: int
        world_size: int
        timeout_s: float = 300.0

    class GlooWeightTransferEngine(NCCLWeightTransferEngine):  # type: ignore[misc, valid-type]
        """Worker side: joins the trainer's gloo group, receives each parameter by broadcast and
        loads it with vLLM's layerwise reload (the same lifecycle as vLLM's NCCL engine)."""

        init_info_cls = GlooWeightTransferInitInfo
        update_info_cls = NCCLWeightTransferUpdateInfo

        def init_transfer_engine(self, init_info: Any) -> None:
            # A rendezvous that fails is not raised here: an exception in a worker RPC ends the
            # vLLM engine, and the trainer side fails on the same rendezvous anyway (the run
            # then goes on with disk). The engine keeps generating without a group.
            pc = self.parallel_config
            rank = pc.data_parallel_index * pc.world_size + pc.rank + init_info.rank_offset
            self.timeout_s = float(init_info.timeout_s)
            self.model_update_group = None
            try:
                self.model_update_group = _gloo_group(
                    init_info.master_address, init_info.master_port, rank, init_info.world_size, self.timeout_s
                )
            except Exception as exc:
                import logging

                logging.getLogger(__name__).warning("joining the gloo weight-transfer group failed: %s", exc)

        def receive_weights(self, update_info: Any) -> None:
            if self.model_update_group is None:
                raise RuntimeError("gloo weight transfer not initialised: call init_transfer_engine first")
            metas = [(n, getattr(torch, d), tuple(sh)) for n, d, sh in zip(update_info.names, update_info.dtype_names, update_info.shapes)]
            for chunk in _chunks(metas):
                flat = torch.empty(sum(_numel(sh) for _, _, sh in chunk), dtype=chunk[0][1])
                _broadcast(self.model_update_group, flat, self.timeout_s)
                self.model.load_weights(
                    (name, piece.view(shape).to(self.device)) for (name, _, shape), piece in zip(chunk, flat.split([_numel(sh) for _, _, sh in chunk]))
                )

        def shutdown(self) -> None:
            self.model_update_group = None  # gloo groups need no collective teardown

    @dataclass
    class GlooTrainerInitInfo(NCCLTrainerInitInfo):  # type: ignore[misc, valid-type]
        """Trainer side: the group's rendezvous, its size (1 + generator workers), a timeout."""

        backend: ClassVar[str] = "gloo"
        timeout_s: float = 300.0

    class GlooTrainerWeightTransferEngine(NCCLTrainerWeightTransferEngine):  # type: ignore[misc, valid-type]
        """Trainer side: vLLM's NCCL round trip (client calls, metadata checks) with the
        broadcast done over gloo, one parameter at a time."""

        init_info_cls = GlooTrainerInitInfo

        @classmethod
        def trainer_init(cls, init_info: Any, *, client: Any, source: Any = None) -> Any:
            engine = cls(client=client, source=source, is_sender=init_info.is_sender, packed=False)
            engine.timeout_s = float(init_info.timeout_s)
            if not engine.is_sender:
                return engine
            worker_info = {
                "master_address": init_info.master_address,
                "master_port": init_info.master_port,
                "rank_offset": 1,
                "world_size": init_info.world_size,
                "timeout_s": init_info.timeout_s,
            }
            with ThreadPoolExecutor(max_workers=1) as exe:  # both sides meet in the rendezvous
                future = exe.submit(client.init_weight_transfer_engine, worker_info)
                engine.model_update_group = _gloo_group(
                    init_info.master_address, init_info.master_port, 0, init_info.world_size, engine.timeout_s
                )
                future.result()
            return engine

        def _broadcast(self, source: Any, meta: list[Any]) -> None:
            if not self.is_sender:
                for _ in source:
                    pass
                return
            pairs = iter(self._checked_iter(source, meta))
            for chunk in _chunks([(m.name, m.dtype, tuple(m.shape)) for m in meta]):
                # the group is gloo on the CPU (vLLM's workers receive into CPU buffers): a GPU
                # learner's tensors are packed on its device and copied to host memory here
                flat = _on_host(torch.cat([next(pairs)[1].reshape(-1) for _ in chunk]))
                _broadcast(self.model_update_group, flat, self.timeout_s)
            for _ in pairs:  # the source's own end-of-stream check
                pass

        def shutdown(self) -> None:
            self.model_update_group = None

    _CLASSES.update(
        engine=GlooWeightTransferEngine,
        trainer=GlooTrainerWeightTransferEngine,
        trainer_info=GlooTrainerInitInfo,
        source=ModelSource,
    )
    return _CLASSES


_CLASSES: dict[str, type] = {}


def __getattr__(name: str) -> Any:
    """``GlooWeightTransferEngine``, built on first access (what vLLM's factory loads by name)."""
    if name == "GlooWeightTransferEngine":
        return _classes()["engine"]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def register() -> None:
    """vLLM general plugin (run in every vLLM process): register the ``gloo`` engine by name, so
    that nothing of it is imported unless a recipe asks for ``weight_sync = "gloo"``."""
    from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory

    if "gloo" not in WeightTransferEngineFactory._registry:
        WeightTransferEngineFactory.register_engine("gloo", __name__, "GlooWeightTransferEngine")


def trainer_connect(
    backend: str,
    *,
    rank: int,
    address: str,
    port: int,
    world_size: int,
    client: GeneratorClient | None,
    source: Any,
    timeout_s: float,
) -> Any:
    """Open the transfer group on trainer rank ``rank`` (0 sends and drives the generators through
    ``client``; other ranks only join the FSDP gathers). Returns the trainer engine, whose
    ``send_weights()`` runs one update. ``ipc`` forms no group (``address``, ``port`` and
    ``world_size`` are unused): each rank shares its GPU's copy by CUDA IPC handles, in packed
    chunks (:func:`ipc_buffer_bytes`)."""
    if backend == "gloo":
        c = _classes()
        info = c["trainer_info"](master_address=address, master_port=port, world_size=world_size, rank=rank, timeout_s=timeout_s)
        return c["trainer"].trainer_init(info, client=client, source=source)
    if backend == "nccl":
        from vllm.distributed.weight_transfer.nccl_engine import (
            NCCLTrainerInitInfo,
            NCCLTrainerWeightTransferEngine,
        )

        info = NCCLTrainerInitInfo(master_address=address, master_port=port, world_size=world_size, rank=rank)
        return NCCLTrainerWeightTransferEngine.trainer_init(info, client=client, source=source)
    if backend == "ipc":
        from vllm.distributed.weight_transfer.ipc_engine import (
            IPCTrainerInitInfo,
            IPCTrainerWeightTransferEngine,
        )

        sizes = [_numel(tuple(m.shape)) * torch.empty((), dtype=m.dtype).element_size() for m in source.metadata()]
        info = IPCTrainerInitInfo(rank=rank, packed=True, packed_buffer_size_bytes=ipc_buffer_bytes(sizes))
        return IPCTrainerWeightTransferEngine.trainer_init(info, client=client, source=source)
    from agentrl.errors import ConfigError

    raise ConfigError(f"generator.weight_sync: unknown backend {backend!r} (expected one of {BACKENDS})")
