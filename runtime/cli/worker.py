"""`outrider worker`: lend this machine's devices to another machine's Outrider, over
llama.cpp's RPC backend (the same protocol as llama.cpp's rpc-server; docs/distributed.md).

    outrider worker                          # the CPU (or the GPUs) on 127.0.0.1:50052
    outrider worker --host 10.0.0.2 --port 50052 --device CUDA0

    Outrider worker: lending CPU (AMD EPYC 7B13), 22.9 GiB total, 21.3 GiB free
    listening on 127.0.0.1:50052 (llama.cpp RPC 7.0.0): load with --worker 127.0.0.1:50052

and on the other machine `outrider serve --worker 10.0.0.2:50052` (or Settings → Model →
Workers). The worker binds loopback unless told otherwise: llama.cpp's RPC protocol has no
authentication and no encryption, and whoever reaches the port can allocate memory and run
graphs on this machine, so another address gets a warning naming the safe ways (a private
network, or an SSH tunnel to a loopback worker).

The last line is printed once the worker has answered its own probe (the handshake another
machine's Outrider makes), so a script or the app's Server page can wait for it. With
`--parent-pid PID` it stops when that process ends (the app gives its own: a crashed app
leaves no worker serving).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from typing import Any

from runtime.errors import PortInUse, SettingsError
from runtime.paths import user_dirs
from runtime.planner.workers import exposure_warning
from runtime.settings.load import DEFAULT_WORKER_PORT, worker_endpoint
from runtime.units import fmt_bytes

READY = "listening on"  # the start of the line printed once the worker serves
PROBE_TRIES = 100  # x 0.1 s: llama.cpp starts listening within milliseconds


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "worker", help="lend this machine's CPU or GPUs to another Outrider (llama.cpp RPC)",
        description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1",
                        help="address to listen on (default 127.0.0.1; another address is "
                             "open to anyone who can reach it)")
    parser.add_argument("--port", type=int, default=DEFAULT_WORKER_PORT,
                        help=f"port (default {DEFAULT_WORKER_PORT})")
    parser.add_argument("--device", action="append", default=[], metavar="NAME",
                        help="a device to lend, by ggml's name (CPU, CUDA0, MTL0; repeatable; "
                             "default: the GPUs, or the CPU when there is none)")
    parser.add_argument("--threads", type=int, default=None,
                        help="CPU threads for the graphs it runs (default: one per physical core)")
    parser.add_argument("--parent-pid", type=int,
                        help="stop when this process ends (the app's Server page gives its own)")
    parser.add_argument("--no-cache", action="store_true",
                        help="do not keep large tensors sent to it on disk (by default the "
                             "next load of the same model sends them again only if changed)")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    # start-up time: only `worker` loads ggml's RPC server
    from runtime.llama.params import default_threads
    from runtime.llama.rpc import LocalDevice, local_devices, rpc_available, serve
    from runtime.planner.workers import probe_worker
    from runtime.server.serve import bind_socket, watch_parent

    if args.threads is not None and args.threads < 1:
        raise SettingsError(f"--threads must be at least 1, not {args.threads}")
    endpoint = worker_endpoint(f"{args.host}:{args.port}")
    if not rpc_available():
        raise SettingsError("this llama.cpp build has no RPC backend: rebuild it with `make`")
    devices = _chosen(local_devices(), args.device)
    bind_socket(args.host, args.port).close()  # PortInUse / a bad host, in words, now
    warning = exposure_warning(args.host, args.port)
    if warning:
        print(warning, file=sys.stderr, flush=True)
    for device in devices:
        print(f"Outrider worker: lending {device.name} ({device.description}), "
              f"{fmt_bytes(device.total_bytes)} total, {fmt_bytes(device.free_bytes)} free",
              flush=True)
    cache = None if args.no_cache else user_dirs().cache / "rpc"
    if cache is not None:
        cache.mkdir(parents=True, exist_ok=True)
    threads = args.threads or default_threads()
    ended = threading.Event()

    def serve_until_it_returns(chosen: list[LocalDevice]) -> None:
        try:
            serve(endpoint, chosen, threads, cache)
        finally:
            ended.set()

    server = threading.Thread(target=serve_until_it_returns, args=(devices,), daemon=True,
                              name="outrider-worker")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    if args.parent_pid is not None:
        watch_parent(args.parent_pid, ended.set)  # the app died without stopping us
    # From here stdout carries Outrider's lines only: llama.cpp's server prints its own
    # ("Accepted client connection", ...) with C's printf, which goes to stderr instead.
    sys.stdout.flush()
    ours = os.dup(sys.stdout.fileno())
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    server.start()
    info = None
    for _ in range(PROBE_TRIES):
        if ended.wait(0.1):
            break
        try:
            info = probe_worker(f"{_loopback_for(args.host)}:{args.port}", timeout_s=2.0)
            break
        except SettingsError:
            continue
    if info is None:
        raise PortInUse(f"the worker could not listen on {endpoint}: is another program "
                        "holding the port?")
    major, minor, patch = info.version
    _say(ours, f"{READY} {endpoint} (llama.cpp RPC {major}.{minor}.{patch}): load with "
         f"--worker {endpoint}")
    try:
        while not ended.wait(1.0):
            pass
    except KeyboardInterrupt:
        pass
    _say(ours, "worker stopped")
    return 0


def _say(fd: int, line: str) -> None:
    """One line on Outrider's stdout `fd`, in one write."""
    os.write(fd, (line + "\n").encode())


def _chosen(devices: list[Any], names: list[str]) -> list[Any]:
    """The devices named on the command line, or the GPUs, or the CPU."""
    if names:
        by_name = {d.name.lower(): d for d in devices}
        missing = [n for n in names if n.lower() not in by_name]
        if missing:
            have = ", ".join(d.name for d in devices)
            raise SettingsError(f"no device {missing[0]!r} here: this machine has {have}")
        return [by_name[n.lower()] for n in dict.fromkeys(names)]
    # start-up time: as in `run`
    from runtime.llama.rpc import DEVICE_CPU

    gpus = [d for d in devices if d.type != DEVICE_CPU]
    return gpus or [d for d in devices if d.type == DEVICE_CPU][:1]


def _loopback_for(host: str) -> str:
    """Where this machine reaches its own worker: 127.0.0.1 when it listens on all addresses."""
    return "127.0.0.1" if host in ("0.0.0.0", "") else host
