"""Every record of a `TrajectoryFiles` index, read page after page as the viewer's list loads them."""

from __future__ import annotations

from typing import Any

from agent_runtime.serving import TrajectoryFiles, TrajectoryFilter


def every_summary(files: TrajectoryFiles, where: TrajectoryFilter | None = None) -> list[Any]:
    """The summaries of every record that passes `where`, in record order; a malformed line fails the test."""
    items: list[Any] = []
    offset = 0
    while True:
        page = files.page(offset, limit=500, where=where, max_scan=100_000)
        assert page["malformed"] == 0, page["malformed_lines"]
        items += page["items"]
        offset = page["next_offset"]
        if page["done"]:
            return items
