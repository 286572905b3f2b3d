"""``nbformat``, imported without the second and a half that one of its dependencies costs.

nbformat imports jsonschema, which imports ``rfc3987_syntax`` where it is installed (JupyterLab's
``jupyter-events`` brings it) to check the "iri" string format; that module builds 39 Earley
parsers when it is imported: about 1.5 s of CPU in every process that reads a notebook (each
``kvlab grade``, each grading process, ``kvlab labs``). nbformat never checks string formats, so
kvlab's modules import it through here, with that one module held back while jsonschema is
imported. Nothing else changes: a later ``import rfc3987_syntax`` works as usual.
"""

from __future__ import annotations

import sys

_SLOW = "rfc3987_syntax"

if "jsonschema" not in sys.modules and _SLOW not in sys.modules:
    sys.modules[_SLOW] = None  # type: ignore[assignment]  # `import` raises ImportError
    try:
        import nbformat
    finally:
        if sys.modules.get(_SLOW, False) is None:
            del sys.modules[_SLOW]

import nbformat  # noqa: E402

__all__ = ["nbformat"]
