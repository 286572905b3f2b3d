"""A deterministic SVG of one frame: the static fallback that GitHub, nbviewer and nbval see."""

from __future__ import annotations

from html import escape

from kvlab.widgets.frames import room_states

CELL, GAP, LABEL, TOP = 12, 1, 28, 34


def frame_svg(data: dict, step: int, rooms_per_floor: int, title: str = "") -> str:
    states = room_states(data, step)
    size = data["beds_per_room"]
    floors = -(-data["num_rooms"] // rooms_per_floor)
    width = LABEL + rooms_per_floor * (CELL + GAP)
    height = TOP + floors * (CELL + GAP) + 4
    frame = data["frames"][step]
    m = frame["metrics"]
    who = "" if frame["guest"] is None else f" {frame['guest']}"
    caption = (
        f"step {step + 1}/{len(data['frames'])} · t={frame['time']:.2f} s · {frame['event']}{who} · "
        f"rooms used {m['rooms_used']}/{data['num_rooms']} · utilization {100 * m['utilization']:.1f}%"
    )
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" font-family="sans-serif">',
        f'<text x="2" y="12" font-size="11" font-weight="bold">{escape(title or "hotel floor plan")}</text>',
        f'<text x="2" y="26" font-size="9">{escape(caption)}</text>',
    ]
    for floor in range(floors):
        y = TOP + floor * (CELL + GAP)
        parts.append(
            f'<text x="{LABEL - 4}" y="{y + CELL - 2}" font-size="8" text-anchor="end">{floor}</text>'
        )
    for room, (owner, used, refs) in enumerate(states):
        floor, col = divmod(room, rooms_per_floor)
        x, y = LABEL + col * (CELL + GAP), TOP + floor * (CELL + GAP)
        if owner < 0:
            parts.append(
                f'<rect x="{x}" y="{y}" width="{CELL}" height="{CELL}" fill="#fff" stroke="#d0d7de"/>'
            )
            continue
        color = data["colors"][owner]
        stroke = ' stroke="#000" stroke-width="1.5"' if refs > 1 else ""
        parts.append(
            f'<rect x="{x}" y="{y}" width="{CELL}" height="{CELL}" fill="{color}" fill-opacity="0.25"{stroke}/>'
        )
        h = round(CELL * used / size, 2)
        if h:
            parts.append(
                f'<rect x="{x}" y="{y + CELL - h}" width="{CELL}" height="{h}" fill="{color}"/>'
            )
    parts.append("</svg>")
    return "\n".join(parts)
