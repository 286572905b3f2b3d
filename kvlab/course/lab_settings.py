"""JupyterLab defaults for the course, written where JupyterLab reads an environment's overrides
(``<prefix>/share/jupyter/lab/settings/overrides.json``): no "Would you like to get notified about
official Jupyter news?" toast over the right side of every output, and no update check (no
network at run time). A learner's own settings still win: these are only defaults.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

OVERRIDES = {
    "@jupyterlab/apputils-extension:notification": {"fetchNews": "false", "checkForUpdates": False},
}


def overrides_path(prefix: str | Path = sys.prefix) -> Path:
    return Path(prefix) / "share" / "jupyter" / "lab" / "settings" / "overrides.json"


def write_overrides(prefix: str | Path = sys.prefix) -> Path:
    """Merge :data:`OVERRIDES` into the environment's overrides.json (other keys are kept)."""
    path = overrides_path(prefix)
    try:
        current = json.loads(path.read_text())
    except (FileNotFoundError, ValueError):
        current = {}
    if not isinstance(current, dict):
        current = {}
    for plugin, values in OVERRIDES.items():
        current[plugin] = {**current.get(plugin, {}), **values}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(current, indent=2) + "\n")
    return path


if __name__ == "__main__":
    print(f"kvlab: JupyterLab defaults (no news toast) in {write_overrides()}")
