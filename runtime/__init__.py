"""Outrider's headless engine: GGUF reading, planning, inference, serving, hub downloads.

Never imports Qt or `app` (an import-linter contract checks it).
"""

__version__ = "0.1.0"
