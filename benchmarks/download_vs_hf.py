"""Download throughput over loopback: Outrider's DownloadManager vs plain `hf_hub_download`.

Both fetch the same generated file from the fake Hugging Face server (tests/hubserver), run in
its own process so the server does not compete with the client for the GIL. Outrider's time
includes what plain hf_hub_download does not do: the sha256 of every byte and the move into
the library. Runs alternate which client goes first; the table shows each run and the median.

    .venv/bin/python benchmarks/download_vs_hf.py --size-mb 200 --repeats 3

Goal: ours ≥ 0.95 × hf_hub_download.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from huggingface_hub import hf_hub_download  # noqa: E402

from runtime.downloads.manager import DownloadManager  # noqa: E402
from runtime.hub.client import Hub  # noqa: E402

REPO = "bench/Bench-GGUF"


def make_file(path: Path, size_mb: int) -> Path:
    if path.is_file() and path.stat().st_size == size_mb << 20:
        return path
    block = os.urandom(1 << 20)
    with path.open("wb") as f:
        for i in range(size_mb):
            f.write(block[i % 251:] + block[: i % 251])  # not one repeated block
    return path


def start_server(path: Path, redirect: bool) -> tuple[subprocess.Popen[str], str]:
    cmd = [sys.executable, "-c", "from tests.hubserver.server import main; main()", str(path),
           "--repo", REPO]
    if not redirect:
        cmd.append("--no-redirect")
    proc = subprocess.Popen(cmd, cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    url = proc.stdout.readline().strip()
    if not url.startswith("http"):
        proc.kill()
        raise SystemExit(f"the fake hub did not start: {url!r}")
    return proc, url


def ours(url: str, filename: str, work: Path) -> float:
    manager = DownloadManager(Hub(endpoint=url), models_dir=work / "models",
                              downloads_dir=work / "downloads", progress_interval=0.5)
    manager.start()
    t0 = time.perf_counter()
    job = manager.enqueue(REPO, filename)
    [done] = manager.wait([job.id])
    elapsed = time.perf_counter() - t0
    manager.shutdown()
    if done.state != "done":
        raise SystemExit(f"Outrider's download failed: {done.error}")
    return elapsed


def plain_hf(url: str, filename: str, work: Path) -> float:
    t0 = time.perf_counter()
    hf_hub_download(REPO, filename, endpoint=url, cache_dir=work / "hf")
    return time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mb", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()) / "outrider-dl-bench")
    parser.add_argument("--no-redirect", action="store_true",
                        help="serve from resolve/ directly instead of the Hub-like CDN redirect")
    args = parser.parse_args()
    args.workdir.mkdir(parents=True, exist_ok=True)
    source = make_file(args.workdir / f"bench-{args.size_mb}MB.gguf", args.size_mb)
    proc, url = start_server(source, not args.no_redirect)
    rows = []
    try:
        for i in range(args.repeats):
            order = [("ours", ours), ("hf", plain_hf)]
            if i % 2:
                order.reverse()
            times: dict[str, float] = {}
            for name, fn in order:
                work = args.workdir / f"run-{name}"
                shutil.rmtree(work, ignore_errors=True)
                times[name] = fn(url, source.name, work)
                shutil.rmtree(work, ignore_errors=True)
            rows.append(times)
    finally:
        assert proc.stdin is not None
        proc.stdin.close()
        proc.wait(10)
    mb = args.size_mb
    print(f"file: {mb} MiB over loopback ({'CDN redirect' if not args.no_redirect else 'direct'}), "
          f"{args.repeats} runs, order alternating")
    print(f"{'run':>3}  {'outrider MiB/s':>14}  {'hf_hub_download MiB/s':>21}  {'ratio':>6}")
    ratios = []
    for i, t in enumerate(rows, 1):
        ratio = t["hf"] / t["ours"]
        ratios.append(ratio)
        print(f"{i:>3}  {mb / t['ours']:>14.0f}  {mb / t['hf']:>21.0f}  {ratio:>6.2f}")
    med_ours = statistics.median(t["ours"] for t in rows)
    med_hf = statistics.median(t["hf"] for t in rows)
    print(f"{'med':>3}  {mb / med_ours:>14.0f}  {mb / med_hf:>21.0f}  {statistics.median(ratios):>6.2f}"
          "   (goal ≥ 0.95; ours also hashes every byte)")


if __name__ == "__main__":
    main()
