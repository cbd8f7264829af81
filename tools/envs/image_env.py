"""The image environment: read small text in a large image by zooming in (``tools.envs.image_env:pack``).

Each task has its own scene: a large canvas (2000x1500 by default) with grey clutter and a
few labels, each a short code or number in a coloured frame, its font 8 to 10 pixels.
The whole image seen at once (``view_image``, scaled to 768 pixels) shrinks that text to
3 or 4 pixels: unreadable. Reading it takes a ``zoom`` on the right frame, and for a label
printed sideways or upside down a ``rotate`` of that view as well.

The world holds the scene, not its pixels: tables must stay JSON-like (they are copied per
session, compared, dumped to ``state.json``), and a bitmap is megabytes. ``scene.image`` is
the scene's description (size, seed, labels with their boxes); the pixels are drawn from it
on demand by ``tools.images.Renderer``, which keeps the last few scenes drawn for the whole
process: the sessions of one task (a GRPO group plays the same task many times at once)
share one bitmap instead of drawing and holding one each.

``targets`` holds one record per label the task asks about, ``revealed`` once a view showed
it legibly (whole, upright, its font at least ``LEGIBLE_PX`` pixels high at the view's
scale). The gold calls reveal every target, so the ``tool_use`` verifier's ``state``
component is exactly "did the model look at the right place closely enough", and ``answer``
the exact answer (both are the tasks' reward basis). The current view (what ``rotate`` turns
and ``ink_grid`` measures) is the last view shown, read from the session's call log: where
the model looks is no part of the compared state, so looking around costs nothing.

Levels: 1 the code in one frame (zoom); 2 the sum of the numbers in two frames (two zooms);
3 the code of a rotated label (zoom, then rotate).
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from typing import Any

from protocol import ErrorKind, ToolError, ToolOutput
from tools.envs.pack import Complexity, EnvTask, EnvTool, Gold, GoldCall, Pack, PackInfo
from tools.envs.world import World
from tools.images import COLOURS, FRAME_PAD, Renderer, colour_at, colour_box, ink_grid, label_box, png, view

__all__ = ["LEGIBLE_PX", "POLICY", "TOOLS", "VIEW_SIDE", "pack", "renderer"]

VIEW_SIDE = 768  # a view's longer side, in pixels
MAX_ZOOM = 8.0
LEGIBLE_PX = 16  # a label is legible in a view where its font size times the scale is at least this
LABEL_SIZES = (8, 9, 10)
CODE_ALPHABET = "ACDEFHJKLMNPRTUVWXY34679"  # no look-alikes (0/O, 1/I, 2/Z, 5/S, 8/B)
CODE_LENGTH = 4
GOLD_MARGIN = 24  # pixels around a frame in a gold zoom
CLUTTER = 70
SCENES_KEPT = 8  # rendered scenes held per process (2000x1500 RGB: 9 MB each)
DESCRIPTION = "Large images with small labels in coloured frames: zoom, rotate and measure to read them."
POLICY = """You inspect a large image with tools.
Coordinates are pixels of the full image: x grows to the right, y downwards, (0, 0) is the top left.
view_image shows the whole image, too small to read its labels; zoom shows a box of it enlarged;
rotate turns the current view. pixel_color, find_color and ink_grid measure the image without reading it:
a colour at a point, where a frame colour is, where the dark text is.
Read an answer only from a view where the text is clearly legible. End with <answer>...</answer>."""

renderer = Renderer(SCENES_KEPT)
_VIEW_TOOLS = ("view_image", "zoom", "rotate")  # the tools that show a view (and set the current one)


# --------------------------------------------------------------------------- tools


def _scene(world: World) -> Mapping[str, Any]:
    return world["scene"].peek("image")


def _box(scene: Mapping[str, Any], x0: int, y0: int, x1: int, y1: int) -> list[int]:
    """The box clipped to the image; an empty or tiny one is refused."""
    width, height = scene["width"], scene["height"]
    box = [max(0, min(x0, x1)), max(0, min(y0, y1)), min(width, max(x0, x1)), min(height, max(y0, y1))]
    if box[2] - box[0] < 4 or box[3] - box[1] < 4:
        raise ToolError(
            f"the box ({x0}, {y0})-({x1}, {y1}) leaves less than 4x4 pixels inside the {width}x{height} image",
            ErrorKind.INVALID_ARGUMENTS,
        )
    return box


def _current_view(world: World) -> tuple[list[int], int]:
    """Box and rotation of the last view shown (from the call log); the whole image before any."""
    for record in reversed(world.calls):
        if record.name in _VIEW_TOOLS and record.error is None and isinstance(record.output, dict):
            return list(record.output["box"]), int(record.output["rotation"])
    scene = _scene(world)
    return [0, 0, scene["width"], scene["height"]], 0


def _framed(label: Mapping[str, Any], box: Sequence[int], scale: float) -> bool:
    """The label's text lies inside the view, large enough to read once turned upright."""
    x0, y0, x1, y1 = label["text_box"]
    inside = box[0] <= x0 and box[1] <= y0 and x1 <= box[2] and y1 <= box[3]
    return inside and label["size"] * scale >= LEGIBLE_PX


def _legible(label: Mapping[str, Any], box: Sequence[int], rotation: int, scale: float) -> bool:
    return _framed(label, box, scale) and (label["rotation"] + rotation) % 360 == 0


def _show(world: World, box: list[int], rotation: int) -> ToolOutput:
    """Show ``box`` turned by ``rotation`` (the call log keeps both: the current view), revealing
    the targets it makes legible."""
    scene = _scene(world)
    shown, scale = view(renderer(scene), box, rotation, VIEW_SIDE, MAX_ZOOM)
    labels = {label["id"]: label for label in scene["labels"]}
    targets = world["targets"]
    for key in list(targets):
        target = targets.peek(key)
        if not target["revealed"] and _legible(labels[target["label"]], box, rotation, scale):
            targets[key] = {**target, "revealed": True}
    turned = f", turned {rotation} degrees counter-clockwise" if rotation else ""
    text = (
        f"View of ({box[0]}, {box[1]})-({box[2]}, {box[3]}) of the {scene['width']}x{scene['height']} image "
        f"at {scale:.2f}x{turned}: {shown.width}x{shown.height} pixels."
    )
    structured = {
        "box": box,
        "rotation": rotation,
        "scale": round(scale, 4),
        "size": [shown.width, shown.height],
        # which frames the view holds, readable (once upright): what the tool_use reward checks
        # a zoom found (the gold zoom's ``finds``); the model reads the text, not this
        "in_view": [label["id"] for label in scene["labels"] if _framed(label, box, scale)],
    }
    return ToolOutput.image(png(shown), "image/png", text, structured)


def view_image(world: World) -> ToolOutput:
    scene = _scene(world)
    return _show(world, [0, 0, scene["width"], scene["height"]], 0)


def zoom(world: World, x0: int, y0: int, x1: int, y1: int) -> ToolOutput:
    return _show(world, _box(_scene(world), x0, y0, x1, y1), 0)


def rotate(world: World, degrees: int) -> ToolOutput:
    if degrees not in (90, 180, 270):
        raise ToolError(f"degrees must be 90, 180 or 270, got {degrees}", ErrorKind.INVALID_ARGUMENTS)
    box, rotation = _current_view(world)
    return _show(world, box, (rotation + degrees) % 360)


def pixel_color(world: World, x: int, y: int) -> dict[str, Any]:
    scene = _scene(world)
    if not (0 <= x < scene["width"] and 0 <= y < scene["height"]):
        raise ToolError(
            f"({x}, {y}) is outside the {scene['width']}x{scene['height']} image", ErrorKind.INVALID_ARGUMENTS
        )
    rgb = colour_at(renderer(scene), x, y)
    named = [
        name for name, ref in COLOURS.items() if max(abs(a - b) for a, b in zip(rgb, ref, strict=True)) <= 40
    ]
    return {
        "x": x,
        "y": y,
        "rgb": list(rgb),
        "hex": "#{:02x}{:02x}{:02x}".format(*rgb),
        "frame_colour": next(iter(named), None),
    }


def find_color(world: World, colour: str) -> dict[str, Any]:
    if colour not in COLOURS:
        raise ToolError(
            f"colour must be one of {', '.join(COLOURS)}, got {colour!r}", ErrorKind.INVALID_ARGUMENTS
        )
    box, count = colour_box(renderer(_scene(world)), COLOURS[colour])
    return {"colour": colour, "box": box, "pixels": count}


def ink_map(world: World, rows: int = 4, cols: int = 4) -> dict[str, Any]:
    if not (1 <= rows <= 8 and 1 <= cols <= 8):
        raise ToolError(
            f"rows and cols must be between 1 and 8, got {rows}x{cols}", ErrorKind.INVALID_ARGUMENTS
        )
    box, _ = _current_view(world)
    cells = ink_grid(renderer(_scene(world)), box, rows, cols)
    return {"box": box, "rows": rows, "cols": cols, "cells": cells}


def _obj(properties: dict[str, Any], required: Sequence[str] = ()) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": properties,
        "required": list(required),
        "additionalProperties": False,
    }


def _int(description: str, **bounds: int) -> dict[str, Any]:
    return {"type": "integer", "description": description, **bounds}


_BOX = _obj(
    {
        "x0": _int("Left edge, in pixels of the full image."),
        "y0": _int("Top edge."),
        "x1": _int("Right edge (exclusive)."),
        "y1": _int("Bottom edge (exclusive)."),
    },
    ["x0", "y0", "x1", "y1"],
)
TOOLS = [
    EnvTool(
        "view_image",
        "Show the whole image, scaled down to 768 pixels on its longer side (small text is not readable at "
        "that scale). It becomes the current view.",
        _obj({}),
        view_image,
        writes=True,
        blocking=True,
    ),
    EnvTool(
        "zoom",
        "Show the box (x0, y0)-(x1, y1) of the full image enlarged to 768 pixels on its longer side (at most "
        "8x). It becomes the current view. Smaller boxes give larger text.",
        _BOX,
        zoom,
        writes=True,
        blocking=True,
    ),
    EnvTool(
        "rotate",
        "Turn the current view counter-clockwise by 90, 180 or 270 degrees and show it (the turns add up).",
        _obj(
            {"degrees": {"type": "integer", "enum": [90, 180, 270], "description": "Counter-clockwise."}},
            ["degrees"],
        ),
        rotate,
        writes=True,
        blocking=True,
    ),
    EnvTool(
        "pixel_color",
        "The colour of the pixel at (x, y) of the full image, and the frame colour it is, if any.",
        _obj({"x": _int("Column.", minimum=0), "y": _int("Row.", minimum=0)}, ["x", "y"]),
        pixel_color,
        blocking=True,
    ),
    EnvTool(
        "find_color",
        "The bounding box of the pixels of a frame colour in the full image (where that frame is).",
        _obj({"colour": {"type": "string", "enum": list(COLOURS)}}, ["colour"]),
        find_color,
        blocking=True,
    ),
    EnvTool(
        "ink_grid",
        "Split the current view into rows x cols cells and give each cell's share of dark text pixels: "
        "where the text is, without reading it.",
        _obj(
            {
                "rows": _int("Rows (1 to 8).", minimum=1, maximum=8),
                "cols": _int("Columns (1 to 8).", minimum=1, maximum=8),
            }
        ),
        ink_map,
        blocking=True,
    ),
]


# --------------------------------------------------------------------------- scenes and tasks


def _code(rng: random.Random) -> str:
    return "".join(rng.choice(CODE_ALPHABET) for _ in range(CODE_LENGTH))


def _scene_for(
    rng: random.Random, width: int, height: int, count: int, texts: Sequence[str], rotations: Sequence[int]
) -> dict[str, Any]:
    """A scene with ``count`` labels in frames of distinct colours, placed apart from each other."""
    colours = rng.sample(list(COLOURS), count)
    labels: list[dict[str, Any]] = []
    taken: list[list[int]] = []
    for index in range(count):
        text, rotation, size = texts[index], rotations[index], rng.choice(LABEL_SIZES)
        for _ in range(500):
            at = (rng.randrange(40, width - 140), rng.randrange(40, height - 140))
            text_box = label_box(text, size, rotation, at)
            frame = [
                text_box[0] - FRAME_PAD,
                text_box[1] - FRAME_PAD,
                text_box[2] + FRAME_PAD,
                text_box[3] + FRAME_PAD,
            ]
            if all(_apart(frame, other, GOLD_MARGIN * 2) for other in taken):
                break
        else:
            raise ValueError(f"cannot place {count} labels apart in a {width}x{height} image")
        taken.append(frame)
        labels.append(
            {
                "id": colours[index],
                "colour": colours[index],
                "text": text,
                "size": size,
                "rotation": rotation,
                "box": frame,
                "text_box": text_box,
            }
        )
    return {
        "width": width,
        "height": height,
        "seed": rng.randrange(2**31),
        "clutter": CLUTTER,
        "labels": labels,
    }


def _apart(a: Sequence[int], b: Sequence[int], gap: int) -> bool:
    return a[2] + gap <= b[0] or b[2] + gap <= a[0] or a[3] + gap <= b[1] or b[3] + gap <= a[1]


def _gold_zoom(scene: Mapping[str, Any], label: Mapping[str, Any], call_id: str) -> GoldCall:
    x0, y0, x1, y1 = label["box"]
    box = _box(scene, x0 - GOLD_MARGIN, y0 - GOLD_MARGIN, x1 + GOLD_MARGIN, y1 + GOLD_MARGIN)
    # Any zoom that frames the label matches (its coordinates are free); one elsewhere finds nothing.
    return GoldCall(
        "zoom",
        dict(zip(("x0", "y0", "x1", "y1"), box, strict=True)),
        id=call_id,
        compare=[],
        finds=[label["id"]],
    )


def _task(rng: random.Random, task_id: str, level: int, width: int, height: int, count: int) -> EnvTask:
    if level == 2:
        texts = [str(rng.randrange(100, 1000)) for _ in range(count)]
    else:
        texts = [_code(rng) for _ in range(count)]
    rotations = [0] * count
    if level == 3:
        rotations[0] = rng.choice((90, 180, 270))
    scene = _scene_for(rng, width, height, count, texts, rotations)
    labels = scene["labels"]
    note = f" The image is {width}x{height} pixels; its labels are too small to read without zooming in."
    if level == 1:
        targets, question = labels[:1], f"What code is written inside the {labels[0]['colour']} frame?"
        calls, answer = [_gold_zoom(scene, labels[0], "z0")], labels[0]["text"]
    elif level == 2:
        targets = labels[:2]
        question = (
            f"What is the sum of the numbers written inside the {labels[0]['colour']} frame and the "
            f"{labels[1]['colour']} frame?"
        )
        calls = [_gold_zoom(scene, labels[0], "z0"), _gold_zoom(scene, labels[1], "z1")]
        answer = str(int(labels[0]["text"]) + int(labels[1]["text"]))
    else:
        targets = labels[:1]
        question = f"The code inside the {labels[0]['colour']} frame is printed turned. What does it say?"
        upright = (360 - labels[0]["rotation"]) % 360
        calls = [
            _gold_zoom(scene, labels[0], "z0"),
            GoldCall("rotate", {"degrees": upright}, id="r0", depends_on=["z0"]),
        ]
        answer = labels[0]["text"]
    return EnvTask(
        id=task_id,
        prompt=[{"role": "user", "content": question + note + " Answer with <answer>...</answer>."}],
        gold=Gold(calls=calls, answer=answer),
        complexity=Complexity.from_calls(calls),
        state_patch={
            "scene": {"image": scene},
            "targets": {label["id"]: {"label": label["id"], "revealed": False} for label in targets},
        },
        reward_basis=["answer", "state"],
        metadata={"level": level},
    )


def pack(
    seed: int = 0,
    tasks: int = 60,
    levels: Sequence[int] | int = (1, 2, 3),
    *,
    width: int = 2000,
    height: int = 1500,
    labels: int = 5,
    pack_id: str | None = None,
) -> Pack:
    """An image pack of ``tasks`` tasks spread over ``levels`` (1 to 3), each with its own scene, from ``seed``.

    The same arguments give the same tasks and scenes; ``labels`` frames per scene (2 to 6).
    """
    levels = (levels,) if isinstance(levels, int) else tuple(int(level) for level in levels)
    if not levels or any(level not in (1, 2, 3) for level in levels):
        raise ValueError(f"levels must be some of 1, 2, 3, got {levels!r}")
    if not 2 <= labels <= len(COLOURS):
        raise ValueError(f"labels must be between 2 and {len(COLOURS)}, got {labels}")
    if width < 400 or height < 300:
        raise ValueError(f"the image must be at least 400x300 pixels, got {width}x{height}")
    if isinstance(tasks, bool) or not isinstance(tasks, int) or tasks < 0:
        raise ValueError(f"tasks must be a whole number >= 0, got {tasks!r}")
    generated = [
        _task(
            random.Random(f"image:{seed}:{index}:{level}"),
            f"image-{seed}-{index:04d}",
            level,
            width,
            height,
            labels,
        )
        for index, level in ((i, levels[i % len(levels)]) for i in range(tasks))
    ]
    rng = random.Random(f"image:{seed}:start")  # the scene of a session bound to no task
    start = _scene_for(rng, width, height, labels, [_code(rng) for _ in range(labels)], [0] * labels)
    state = {
        "scene": {"image": start},
        "targets": {},
    }
    default_id = f"image-s{seed}" + ("" if levels == (1, 2, 3) else "-l" + "".join(map(str, levels)))
    if (width, height, labels) != (2000, 1500, 5):  # other contents, another id: rewards look tasks up by it
        default_id += f"-{width}x{height}-n{labels}"
    info = PackInfo(id=pack_id or default_id, origin="procedural", domain="image", description=DESCRIPTION)
    return Pack(info, list(TOOLS), state, generated, policy=POLICY)
