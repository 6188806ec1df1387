"""Outrider's headless engine: GGUF reading, planning, inference, serving, hub downloads.

Never imports Qt or `app` (an import-linter contract checks it).
"""

from runtime.hugepages import huge_pages_default
from runtime.openmp import spin_default

__version__ = "0.1.0"

spin_default()  # before anything here loads llama.cpp: libgomp reads it once, as it loads
huge_pages_default()  # for the engine processes: glibc reads its tunables as a program starts
