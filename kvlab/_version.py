"""kvlab's version, in a module of its own so that any layer can name it without importing the package's
__init__ (which imports kvlab.ops.runtime, a layer)."""

__version__ = "0.1.0"
