"""Ready tools that show the model an image: `crop` (zoom into a region of one of the task's images) and
`plot_chart` (a bar or line chart drawn from numbers the model passes). Each returns a `ToolOutput`: one PNG and a
line of text saying what it shows.

The task's images are the list under ``"images"`` in the episode's task row (`ToolContext.task`, the row
`Environment.reset(task)` got): image references (a data URL, a ``file://`` URL or a path, as
`agent_protocol.images` reads them) or image bytes, numbered from 0 in the order the row lists them.

`crop` takes a box in pixels of the original image, ``[left, top, right, bottom]`` (right and bottom exclusive,
as Pillow's `Image.crop`), and a `zoom` factor; the region is resized with bicubic resampling to
``floor(width * zoom) x floor(height * zoom)``, the zoom lowered where needed so the result stays within
`max_output_pixels` (the text then says so). A box that is empty or outside the image, or an image number the
task does not have, is a `ToolError` whose message says the image's size or how many images there are. The task's
image is decoded within `max_input_pixels` (`agent_env.image_decoder`: its size from every frame header, agreed
by Pillow); one over it, or one that does not decode, is a `ToolError` saying so.

`plot_chart` draws with matplotlib's Agg canvas (no pyplot, no display) at a fixed size and dpi in matplotlib's
default style, and writes the PNG without metadata, so equal arguments give equal bytes. Rendering holds a lock:
matplotlib's global state is not thread-safe.

Pillow and matplotlib are the extra ``agent-env[vision]``; they are imported on a tool's first call, and building
a tool without them raises an ImportError that names the extra. Both tools run their work on a daemon thread
(the caller's loop is never blocked). This module knows images and charts; nothing about episodes beyond
`ToolContext.task`.
"""

from __future__ import annotations

import importlib.util
import io
import math
import threading
from collections.abc import Sequence
from typing import Annotated, Any, Final, Literal

import msgspec

from agent_env._threads import run_in_daemon_thread
from agent_env.errors import ArgumentError, ToolError
from agent_env.image_decoder import decode_image
from agent_env.tool import ToolBase, ToolContext
from agent_env.tool_output import ToolOutput
from agent_protocol import read_image

__all__ = ["ChartArguments", "ChartTool", "CropArguments", "CropTool", "crop", "plot_chart"]

_EXTRA: Final = "pip install 'agent-env[vision]'"
_chart_lock: Final = threading.Lock()


def _require(module: str, package: str, tool: str) -> None:
    """Raise an ImportError naming the extra when `module` is not installed."""
    if importlib.util.find_spec(module) is None:
        raise ImportError(f"the {tool} tool needs {package}, which is not installed: {_EXTRA}")


class CropArguments(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    bbox: Annotated[
        list[Annotated[int, msgspec.Meta(ge=0)]],
        msgspec.Meta(
            min_length=4,
            max_length=4,
            description="The region to show, [left, top, right, bottom] in pixels of the original image "
            "(right and bottom exclusive: the top-left 100x50 pixels are [0, 0, 100, 50]).",
        ),
    ]
    image: Annotated[int, msgspec.Meta(ge=0, description="Which of the task's images, counted from 0.")] = 0
    zoom: Annotated[
        float,
        msgspec.Meta(ge=1, le=8, description="How many times larger to show the region (lowered to fit the limit)."),
    ] = 2.0


class CropTool(ToolBase):
    """Crop a region of one of the task's images and show it enlarged. See the module docstring."""

    event_loop = "shared"  # the work runs on a daemon thread; the coroutine itself only awaits it
    arguments_type = CropArguments

    def __init__(
        self,
        *,
        name: str = "crop",
        images_key: str = "images",
        max_output_pixels: int = 1024 * 1024,
        timeout_s: float | None = 10.0,
        max_input_pixels: int = 40_000_000,
    ) -> None:
        _require("PIL", "Pillow", name)
        if max_output_pixels < 1 or max_input_pixels < 1:
            raise ValueError(
                f"max_output_pixels and max_input_pixels must be at least 1, got {max_output_pixels} and "
                f"{max_input_pixels}"
            )
        self.name = name
        self.description = (
            "Zoom into one of the task's images: crop the box [left, top, right, bottom] (pixels of the original "
            "image) and return it enlarged, to read small details."
        )
        self.images_key = images_key
        self.max_output_pixels = max_output_pixels
        self.max_input_pixels = max_input_pixels
        self.timeout_s = timeout_s

    async def call(self, arguments: CropArguments, context: ToolContext) -> ToolOutput:
        source = self._source(context, arguments.image)
        return await run_in_daemon_thread(lambda: self._crop(source, arguments), name=f"tool-{self.name}")

    def _source(self, context: ToolContext, index: int) -> str | bytes:
        images = context.task.get(self.images_key)
        if not isinstance(images, Sequence) or isinstance(images, (str, bytes)) or not images:
            raise ToolError("this task has no images to crop", hint="Answer from the text, or use another tool.")
        if index >= len(images):
            count = f"{len(images)} image" + ("s" if len(images) != 1 else "")
            raise ToolError(
                f"there is no image {index}: the task has {count}, numbered 0 to {len(images) - 1}",
                hint=f"Pass an image number from 0 to {len(images) - 1}.",
            )
        image = images[index]
        if not isinstance(image, (str, bytes)):
            raise ToolError(f"task image {index} is a {type(image).__name__}, not an image reference")
        return image

    def _crop(self, source: str | bytes, arguments: CropArguments) -> ToolOutput:

        try:
            data = source if isinstance(source, bytes) else read_image(source)
            opened = decode_image(data, max_pixels=self.max_input_pixels)
        except ValueError as e:
            raise ToolError(f"task image {arguments.image} cannot be read: {e}") from e
        with opened:
            return self._crop_decoded(opened, arguments)

    def _crop_decoded(self, opened: Any, arguments: CropArguments) -> ToolOutput:
        from PIL import Image

        width, height = opened.size
        left, top, right, bottom = arguments.bbox
        where = f"image {arguments.image} is {width}x{height} pixels"
        if right <= left or bottom <= top:
            raise ToolError(
                f"the box {arguments.bbox} is empty: right must be greater than left and bottom greater than top",
                hint="Give the box as [left, top, right, bottom].",
            )
        if right > width or bottom > height:
            raise ToolError(
                f"the box {arguments.bbox} reaches outside the image: {where}, so right must be at most {width} "
                f"and bottom at most {height}",
                hint=f"Give a box within [0, 0, {width}, {height}].",
            )
        region_w, region_h = right - left, bottom - top
        zoom = min(arguments.zoom, math.sqrt(self.max_output_pixels / (region_w * region_h)))
        size = (max(1, math.floor(region_w * zoom)), max(1, math.floor(region_h * zoom)))
        picture = opened.convert("RGBA" if _has_alpha(opened) else "RGB")
        region = picture.crop((left, top, right, bottom))
        if size != region.size:
            region = region.resize(size, Image.Resampling.BICUBIC)
        buffer = io.BytesIO()
        region.save(buffer, format="PNG")
        capped = f" (zoom lowered from {arguments.zoom:g} to stay within {self.max_output_pixels} pixels)"
        text = (
            f"Image {arguments.image}, box {arguments.bbox} ({region_w}x{region_h} pixels), shown at "
            f"{size[0]}x{size[1]}{capped if zoom < arguments.zoom else ''}."
        )
        return ToolOutput(text=text, images=(buffer.getvalue(),))


def _has_alpha(image: Any) -> bool:
    return image.mode in ("RGBA", "LA", "PA") or "transparency" in image.info


class ChartArguments(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    labels: Annotated[
        list[Annotated[str, msgspec.Meta(max_length=40)]],
        msgspec.Meta(min_length=1, max_length=50, description="One label per value, in order (the x axis)."),
    ]
    values: Annotated[
        list[float], msgspec.Meta(min_length=1, max_length=50, description="The numbers to plot, one per label.")
    ]
    kind: Annotated[Literal["bar", "line"], msgspec.Meta(description="A bar chart or a line chart.")] = "bar"
    title: Annotated[str, msgspec.Meta(max_length=100, description="The chart's title.")] = ""
    x_label: Annotated[str, msgspec.Meta(max_length=60, description="The x axis's label.")] = ""
    y_label: Annotated[str, msgspec.Meta(max_length=60, description="The y axis's label.")] = ""


class ChartTool(ToolBase):
    """Draw a bar or line chart of the numbers the model passes. See the module docstring."""

    event_loop = "shared"  # the work runs on a daemon thread; the coroutine itself only awaits it
    arguments_type = ChartArguments

    def __init__(
        self,
        *,
        name: str = "plot_chart",
        width: int = 640,
        height: int = 480,
        dpi: int = 100,
        timeout_s: float | None = 20.0,
    ) -> None:
        _require("matplotlib", "matplotlib", name)
        if min(width, height, dpi) < 1:
            raise ValueError(f"width, height and dpi must be positive, got {width}, {height}, {dpi}")
        self.name = name
        self.description = "Draw a bar or line chart of the given values (one per label) and return it as an image."
        self.width = width
        self.height = height
        self.dpi = dpi
        self.timeout_s = timeout_s

    def parse_arguments(self, arguments: dict[str, Any]) -> ChartArguments:
        parsed: ChartArguments = super().parse_arguments(arguments)
        if len(parsed.values) != len(parsed.labels):
            raise ArgumentError(
                "values", f"has {len(parsed.values)} numbers for {len(parsed.labels)} labels; give one per label"
            )
        for k, value in enumerate(parsed.values):
            if not math.isfinite(value):
                raise ArgumentError(f"values[{k}]", f"{value} is not a finite number")
        return parsed

    async def call(self, arguments: ChartArguments, context: ToolContext) -> ToolOutput:
        png = await run_in_daemon_thread(lambda: self.render(arguments), name=f"tool-{self.name}")
        title = f" titled {arguments.title!r}" if arguments.title else ""
        text = f"A {arguments.kind} chart{title} of {len(arguments.values)} values, {self.width}x{self.height} pixels."
        return ToolOutput(text=text, images=(png,))

    def render(self, arguments: ChartArguments) -> bytes:
        """The chart as PNG bytes of exactly `width` x `height` pixels."""
        import matplotlib.style
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure

        with _chart_lock, matplotlib.style.context("default"):
            figure = Figure(figsize=(self.width / self.dpi, self.height / self.dpi), dpi=self.dpi)
            FigureCanvasAgg(figure)
            axes = figure.add_subplot()
            positions = range(len(arguments.values))
            if arguments.kind == "bar":
                axes.bar(positions, arguments.values)
            else:
                axes.plot(positions, arguments.values, marker="o")
            axes.set_xticks(list(positions), arguments.labels, rotation=45 if len(arguments.labels) > 6 else 0)
            axes.set_title(arguments.title)
            axes.set_xlabel(arguments.x_label)
            axes.set_ylabel(arguments.y_label)
            figure.tight_layout()
            buffer = io.BytesIO()
            figure.savefig(buffer, format="png", dpi=self.dpi, metadata={"Software": None})
        return buffer.getvalue()


crop: Final = CropTool()
"""A ready crop tool over the task's ``"images"`` (stateless, safe to share across episodes)."""

plot_chart: Final = ChartTool()
"""A ready chart tool, 640x480 pixels (stateless, safe to share across episodes)."""
