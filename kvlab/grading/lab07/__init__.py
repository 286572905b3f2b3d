"""Checks for Lab 07: shared rooms and copy-on-write (:mod:`.cow`), prefix caching (:mod:`.prefix`)
and eviction (:mod:`.eviction`), on kvlab's rules (:mod:`.references`), with :mod:`.hints`."""

from kvlab.grading.lab07 import cow, prefix  # the exercises register in the lab's order

# isort: split
from kvlab.grading.lab07 import eviction
from kvlab.grading.lab07.cow import beam_evening
from kvlab.grading.lab07.eviction import random_day
from kvlab.grading.lab07.hints import *  # noqa: F403 (the hints, by name, for the tests)
from kvlab.grading.lab07.prefix import random_prompt
from kvlab.grading.lab07.references import CachedBlock, cache_prompt, cached_prefix, reference_take

__all__ = ["CachedBlock", "beam_evening", "cache_prompt", "cached_prefix", "cow", "eviction"]
__all__ += ["prefix", "random_day", "random_prompt", "reference_take"]
