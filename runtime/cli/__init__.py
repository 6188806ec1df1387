"""The `outrider` command line: one module per command group, `main.py` their table.

Every command runs an engine in this process or starts engine processes, so the package
gives this process an engine process's environment before any command module loads
llama.cpp: libgomp reads its spin once, as it loads, and the engines a command starts
inherit both settings (`runtime.openmp.prepare_engine_process`). The window never imports
this package; it starts `outrider serve` as a child.
"""

from runtime.openmp import prepare_engine_process

prepare_engine_process()
