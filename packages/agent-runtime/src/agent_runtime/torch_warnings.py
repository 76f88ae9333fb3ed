"""`ignore_pynvml_deprecation`: one warnings filter that every entry point importing torch installs first.

torch warns on import that the pynvml package is deprecated, on every machine, GPU or not. Nothing a user of the
apps can do about it, and it is the first line they would read, so the apps, the local trainer and the
evaluation command drop it. Call it before torch is imported; it changes nothing else.
"""

from __future__ import annotations

import warnings

__all__ = ["ignore_pynvml_deprecation"]


def ignore_pynvml_deprecation() -> None:
    """Ignore torch's import-time FutureWarning about pynvml (only that one)."""
    warnings.filterwarnings("ignore", message="The pynvml package is deprecated", category=FutureWarning)
