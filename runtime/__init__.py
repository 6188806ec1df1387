"""Outrider's headless engine: GGUF reading, planning, inference, serving, hub downloads.

Never imports Qt or `app` (an import-linter contract checks it), and importing it changes
nothing in the process: the environment an engine process runs in is set where one starts
(`runtime.openmp.prepare_engine_process`), not here, where the app's window imports it too.
"""

__version__ = "0.1.0"
