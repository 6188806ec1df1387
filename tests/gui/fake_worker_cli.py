"""A stand-in for `outrider worker` (runtime/cli/worker.py) for the Server page's "Lend this
machine" card: it prints what the real one prints and serves nothing.

    python -m tests.gui.fake_worker_cli --mode serve --host 127.0.0.1 --port 50052
        Outrider worker: lending CPU (Fake CPU), 16.0 GiB total, 12.0 GiB free
        listening on 127.0.0.1:50052 (llama.cpp RPC 7.0.0): load with --worker 127.0.0.1:50052
        … until SIGTERM (exit 0), as the real one

    python -m tests.gui.fake_worker_cli --mode port-in-use --port 50052
        stderr: error: port 50052 on 127.0.0.1 is already in use: …   (exit code 2)
"""

from __future__ import annotations

import argparse
import signal
import sys
import time

LIFETIME_S = 60.0  # a test that forgets to stop it does not leave it behind for long


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mode", choices=("serve", "port-in-use"), default="serve")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=50052)
    parser.add_argument("--parent-pid", type=int, required=True)  # the card always gives it
    args = parser.parse_args(argv)
    endpoint = f"{args.host}:{args.port}"
    if args.mode == "port-in-use":
        print(f"error: port {args.port} on {args.host} is already in use: [Errno 98] Address "
              "already in use", file=sys.stderr, flush=True)
        return 2
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    print("Outrider worker: lending CPU (Fake CPU), 16.0 GiB total, 12.0 GiB free", flush=True)
    print(f"listening on {endpoint} (llama.cpp RPC 7.0.0): load with --worker {endpoint}",
          flush=True)
    deadline = time.monotonic() + LIFETIME_S
    while time.monotonic() < deadline:
        time.sleep(0.05)
    return 0


if __name__ == "__main__":
    sys.exit(main())
