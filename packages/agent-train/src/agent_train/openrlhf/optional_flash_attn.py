"""OpenRLHF 0.11.2 without flash-attn: its one import-time use of it, loaded so that it fails only where used.

``openrlhf/models/ring_attn_utils.py`` imports ``flash_attn.bert_padding`` and ``flash_attn.utils.distributed`` at
module level, and OpenRLHF's DeepSpeed strategy imports that module, so on a machine without flash-attn every
actor fails at start-up, deep in a Ray worker, although only ring attention and sample packing call those
functions (the attention itself is ``--ds.attn_implementation``'s, ``sdpa`` when flash-attn is missing).

`load_ring_attn_utils()` imports that module with stand-ins for those names that raise `FlashAttnMissing` (with
what to install) when called, then removes the stand-ins from ``sys.modules``: nothing else in the process sees a
``flash_attn`` (transformers still finds it absent). `needs_flash_attn(argv)` names the flags that do call it, for
the launcher to refuse before anything starts. It imports torch only when it loads that module.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import types
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

__all__ = ["INSTALL_HINT", "FlashAttnMissing", "flash_attn_installed", "load_ring_attn_utils", "needs_flash_attn"]

INSTALL_HINT: Final = "pip install flash-attn --no-build-isolation (on a GPU node, matching its CUDA and torch)"
_RING_ATTN_UTILS: Final = "openrlhf.models.ring_attn_utils"
_STAND_INS: Final[dict[str, tuple[str, ...]]] = {
    "flash_attn": (),
    "flash_attn.bert_padding": ("index_first_axis", "pad_input", "rearrange", "unpad_input"),
    "flash_attn.utils": (),
    "flash_attn.utils.distributed": ("all_gather",),
}


class FlashAttnMissing(RuntimeError):
    """A flash-attn function was called on a machine without flash-attn."""


def flash_attn_installed() -> bool:
    return importlib.util.find_spec("flash_attn") is not None


def needs_flash_attn(argv: Sequence[str]) -> list[str]:
    """The OpenRLHF flags in `argv` that call flash-attn's functions (sample packing, ring attention, its
    attention kernel)."""
    found: list[str] = []
    args = list(argv)
    for i, arg in enumerate(args):
        value = args[i + 1] if i + 1 < len(args) else ""
        if arg == "--ds.packing_samples":
            found.append(arg)
        elif (arg == "--ds.ring_attn_size" and value not in ("", "1")) or (
            arg == "--ds.attn_implementation" and value.startswith("flash_attention")
        ):
            found.append(f"{arg} {value}")
    return found


def _missing(name: str) -> Any:
    def call(*args: Any, **kwargs: Any) -> Any:
        raise FlashAttnMissing(
            f"flash_attn.{name} was called (sample packing or ring attention) but flash-attn is not installed: "
            f"{INSTALL_HINT}, or leave out --ds.packing_samples and --ds.ring_attn_size"
        )

    return call


def load_ring_attn_utils() -> None:
    """Load OpenRLHF's ring-attention module with flash-attn stand-ins when flash-attn is missing (idempotent;
    nothing when flash-attn is installed or the module is loaded already). The module is executed from its file
    alone (it imports only torch and flash-attn), so the stand-ins are in ``sys.modules`` for no other import."""
    if _RING_ATTN_UTILS in sys.modules or flash_attn_installed():
        return
    import torch  # noqa: F401  (before the stand-ins exist: nothing torch imports may see them)

    spec = importlib.util.find_spec("openrlhf")
    if spec is None or not spec.submodule_search_locations:
        return  # no OpenRLHF: nothing to load
    path = Path(next(iter(spec.submodule_search_locations))) / "models" / "ring_attn_utils.py"
    module_spec = importlib.util.spec_from_file_location(_RING_ATTN_UTILS, path)
    if module_spec is None or module_spec.loader is None:
        return
    module = importlib.util.module_from_spec(module_spec)
    added = [name for name in _STAND_INS if name not in sys.modules]
    for name in added:
        stand_in = types.ModuleType(
            name, "a stand-in: flash-attn is not installed (agent_train.openrlhf.optional_flash_attn)"
        )
        for attribute in _STAND_INS[name]:
            setattr(stand_in, attribute, _missing(attribute))
        sys.modules[name] = stand_in
    sys.modules[_RING_ATTN_UTILS] = module
    try:
        module_spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(_RING_ATTN_UTILS, None)
        raise
    finally:
        for name in added:
            sys.modules.pop(name, None)
