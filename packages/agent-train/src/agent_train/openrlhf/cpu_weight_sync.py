"""The weight sync of ``--device cpu``: DeepSpeed's rank 0 broadcasts each parameter to the vLLM engines over gloo.

OpenRLHF 0.11.2 opens the sync group with vLLM's ``PyNcclCommunicator`` whatever ``--vllm.sync_backend`` says, and
its vLLM worker extension receives into a ``"cuda"`` buffer and calls the model's ``load_weights`` directly. On the
CPU:

- `GlooBroadcastGroup` is the group on both sides: a ``ProcessGroupGloo`` over a ``TCPStore`` that the actor
  (rank 0) hosts at the address and port OpenRLHF picked, with the ``broadcast(tensor, src, stream)`` method
  OpenRLHF calls. `gloo_group_for_actor` replaces OpenRLHF's `stateless_init_process_group` on the actor's side.
- `CpuWorkerExtension` (vLLM's ``worker_extension_cls``, named by `WORKER_EXTENSION`) receives each parameter on
  the CPU in its own dtype, keeps it until the last one of the sync arrives (OpenRLHF marks it with
  ``empty_cache=True``), then loads them all with vLLM's layer-wise ``reload_weights``: vLLM's CPU build repacks
  linear weights after loading, which a direct ``load_weights`` of one tensor does not redo.

Both sides report to `cpu_checks` (what was sent, what was received and whether the engine's weights took
it), which is how a CPU run proves the sync. This module imports torch inside its functions only.
"""

from __future__ import annotations

import datetime
import importlib
from typing import Any, Final

from agent_train.openrlhf import cpu_checks

__all__ = ["WORKER_EXTENSION", "CpuWorkerExtension", "GlooBroadcastGroup", "gloo_group_for_actor"]

WORKER_EXTENSION: Final = "agent_train.openrlhf.cpu_weight_sync.CpuWorkerExtension"
_TIMEOUT: Final = datetime.timedelta(minutes=10)


class GlooBroadcastGroup:
    """A gloo process group between the actor's rank 0 (`rank` 0, hosting the store) and the vLLM workers."""

    def __init__(self, host: str, port: int, rank: int, world_size: int) -> None:
        dist: Any = importlib.import_module("torch.distributed")
        store = dist.TCPStore(host, port, world_size, is_master=rank == 0, timeout=_TIMEOUT)
        self.group: Any = dist.ProcessGroupGloo(
            dist.PrefixStore("agent_weight_sync", store), rank, world_size, _TIMEOUT
        )
        self.rank = rank
        self.world_size = world_size

    def broadcast(self, tensor: Any, src: int = 0, stream: Any = None) -> None:
        """Broadcast `tensor` from `src` in place (`stream` is OpenRLHF's CUDA stream argument: unused)."""
        if self.rank == src:
            cpu_checks.weight_sent(tensor)
        self.group.broadcast(tensor, src).wait()  # gloo's (tensor, root) overload


def gloo_group_for_actor(master_address: str, master_port: int, rank: int, world_size: int, device: Any) -> Any:
    """OpenRLHF's `stateless_init_process_group` (called by the actor's rank 0) on gloo."""
    return GlooBroadcastGroup(master_address, int(master_port), int(rank), int(world_size))


class CpuWorkerExtension:
    """The methods OpenRLHF calls on vLLM's workers (``collective_rpc``), for vLLM's CPU build; vLLM mixes this
    class into its worker, so ``self`` is the worker (`model_runner`, `model_config`)."""

    model_runner: Any
    model_config: Any

    def init_process_group(
        self,
        master_address: str,
        master_port: int,
        rank_offset: int,
        world_size: int,
        group_name: str,
        backend: str = "gloo",
        use_ray: bool = False,
    ) -> None:
        import torch.distributed as dist

        if use_ray:
            raise ValueError("--device cpu syncs weights over its gloo group; --vllm.sync_with_ray is not bridged")
        rank = dist.get_rank() + rank_offset
        self._agent_sync_group = GlooBroadcastGroup(master_address, int(master_port), rank, int(world_size))
        self._agent_pending: list[tuple[str, Any]] = []

    def update_weight(self, name: str, dtype: Any, shape: Any, empty_cache: bool = False) -> None:
        import torch

        weight = torch.empty(tuple(shape), dtype=dtype, device="cpu")
        self._agent_sync_group.broadcast(weight, src=0)
        self._agent_pending.append((name, weight))
        if empty_cache:  # OpenRLHF marks the last parameter of a sync
            self._agent_load_pending()

    def _agent_load_pending(self) -> None:
        weights, self._agent_pending = self._agent_pending, []
        model = self.model_runner.get_model()
        before = cpu_checks.model_digest(model) if cpu_checks.enabled() else ""
        dtype = self.model_config.dtype  # the dtype vLLM holds the model in
        self.model_runner.reload_weights(
            weights_iterator=iter([(name, w.to(dtype)) for name, w in weights]), is_checkpoint_format=True
        )
        cpu_checks.weights_loaded(model, weights, before)

    def update_weight_cuda_ipc(self, *args: Any, **kwargs: Any) -> None:
        raise RuntimeError("--device cpu has no CUDA IPC: the actor must sync over the gloo group")
