"""Render the README's picture, ``assets/hotel_floor_plan.png``, from Lab 03 itself.

The picture is Lab 03's "same evening, animated" cell: max-length suites against paged rooms for
the same 40 guests. The notebook here is the solution's own import cell and the cell that calls
``compare``, unchanged except that the player gets a name; it runs in JupyterLab, the slider goes
to the step the static SVG picks (the moment both hotels together hold the most tokens), the mouse
rests on a paged room so its tooltip shows, and headless Chromium photographs the output.

    .venv/bin/python tests/support/readme_picture.py [--out assets/hotel_floor_plan.png]

Needs what the browser test needs: Debian's chromium and Playwright (never ``playwright install``).
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
import tempfile
from pathlib import Path

from jupyter_browser import jupyter_lab, launch, run_all, why_not

ROOT = Path(__file__).resolve().parents[2]
LAB = ROOT / "solutions" / "03_paged_allocator.ipynb"


def lab_cells(notebook: Path = LAB) -> list[str]:
    """The lab's import cell and its ``compare`` cell, whose last expression becomes ``player``."""
    cells = [
        "".join(c["source"]) for c in json.loads(notebook.read_text())["cells"]
        if c["cell_type"] == "code"
    ]  # fmt: skip
    imports = cells[0]
    (shown,) = [c for c in cells if "compare(" in c and "import compare" in c]
    last = ast.parse(shown).body[-1]
    if not isinstance(last, ast.Expr):
        raise ValueError(f"{notebook.name}: the compare cell must end with the player expression")
    lines = shown.splitlines()
    line = lines[last.lineno - 1]
    lines[last.lineno - 1] = line[: last.col_offset] + "player = " + line[last.col_offset :]
    named = "\n".join(lines) + "\nplayer"
    return [imports, named, "player.slider.value = player.svg_step()\nplayer.slider.value"]


def render(out: Path, width: int = 1100, scale: float = 2) -> dict:
    """Run the cells in JupyterLab and save the player's output as a PNG (``scale`` pixels per
    CSS pixel, crisp where GitHub shrinks it to the README's width); returns what it shows."""
    from playwright.sync_api import sync_playwright

    errors: list[str] = []
    with tempfile.TemporaryDirectory() as tmp, jupyter_lab(Path(tmp), lab_cells()) as url:
        with sync_playwright() as p:
            browser = launch(p)
            page = browser.new_page(
                viewport={"width": width, "height": 1400}, device_scale_factor=scale
            )
            run_all(page, url, 2, errors, out.with_name("readme_picture_failure.png"))
            page.evaluate("window.jupyterapp.shell.collapseLeft()")
            step = int(page.locator(".jp-OutputArea-output").last.inner_text().strip())
            page.wait_for_function(
                f"[...document.querySelectorAll('.kvh')].every(r => Number(r.dataset.step) === {step})"
            )
            player = page.locator(".kvh-compare").locator("xpath=..")
            player.scroll_into_view_if_needed()
            paged = page.locator(".kvh").nth(1)
            paged.locator(".kvh-room.kvh-booked").nth(40).hover()
            page.wait_for_timeout(300)
            box = player.bounding_box()
            margin = 8
            page.screenshot(
                path=str(out),
                clip={  # no top margin: the cell's printed line sits just above
                    "x": box["x"] - margin,
                    "y": box["y"],
                    "width": box["width"] + 2 * margin,
                    "height": box["height"] + 2,
                },
            )
            shown = page.evaluate(
                "() => [...document.querySelectorAll('.kvh')].map(r => ({step: r.dataset.step,"
                " header: r.querySelector('.kvh-metrics').innerText,"
                " tip: r.querySelector('.kvh-tip').innerText}))"
            )
            browser.close()
    if any("kvh" in e or "widget" in e for e in errors):
        raise RuntimeError(f"console errors: {errors}")
    return {"step": step, "hotels": shown}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "assets" / "hotel_floor_plan.png")
    args = parser.parse_args()
    reason = why_not()
    if reason:
        sys.exit(reason)
    print(json.dumps(render(args.out), indent=2))
    print(f"wrote {args.out} ({args.out.stat().st_size:,} bytes)")


if __name__ == "__main__":
    main()
