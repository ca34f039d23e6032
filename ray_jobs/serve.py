"""Serve an index over HTTP with Ray Serve: each replica holds the model and the index.

    python -m ray_jobs.serve --index runs/default/index             # http://127.0.0.1:8000
    curl -s localhost:8000/search -d '{"query": "get the size of the terminal window", "k": 5}'
    open http://127.0.0.1:8000/                                      # the search page
    curl -s localhost:8000/healthz
    ray job submit --address http://127.0.0.1:8265 --working-dir . -- python -m ray_jobs.serve \\
        --index s3://b/indexes/csn --replicas 1-4 --gpus-per-replica 1 --host 0.0.0.0 --detach

Requests arriving together are searched as one batch per replica (--max-batch-size,
--batch-wait-ms); --replicas MIN-MAX lets Serve add replicas under load. Bodies over
--max-body-kb are answered 413. Without --detach it serves until Ctrl-C, then removes the application. With --detach the
job ends and the application keeps running on the cluster (remove it with --stop).
"""

from __future__ import annotations

import argparse
import signal
import threading

from santa.jobs.errors import exit_with, with_exit_codes
from santa.jobs.lifecycle import Job


def _replicas(text: str) -> tuple[int, int | None]:
    """``N`` (a fixed count) or ``MIN-MAX`` (autoscaled)."""
    low, _, high = text.partition("-")
    try:
        return int(low), int(high) if high else None
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give N or MIN-MAX") from None


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The serve command line."""
    parser = with_exit_codes(
        argparse.ArgumentParser(prog="python -m ray_jobs.serve", description=__doc__)
    )
    parser.add_argument("--index", help="index folder (local or s3://)")
    parser.add_argument("--model", default=None, help="model to use instead of the manifest's")
    parser.add_argument(
        "--dim", type=int, default=None, help="serve the first DIM dimensions (Matryoshka)"
    )
    parser.add_argument(
        "--replicas", type=_replicas, default=(1, None), metavar="N|MIN-MAX", help="default 1"
    )
    parser.add_argument("--target-ongoing-requests", type=float, default=4.0, metavar="N")
    parser.add_argument("--max-batch-size", type=int, default=16, help="1: no batching")
    parser.add_argument("--batch-wait-ms", type=float, default=5.0)
    parser.add_argument("--max-body-kb", type=int, default=64, help="larger bodies get a 413")
    parser.add_argument("--cpus-per-replica", type=float, default=1.0)
    parser.add_argument("--gpus-per-replica", type=float, default=0.0)
    parser.add_argument("--max-ongoing-requests", type=int, default=32)
    parser.add_argument("-k", "--top-k", type=int, default=10, help="k when a request omits it")
    parser.add_argument("--host", default="127.0.0.1", help="0.0.0.0 to listen on every interface")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--route-prefix", default="/")
    parser.add_argument("--name", default="santa-search", help="Serve application name")
    parser.add_argument("--detach", action="store_true", help="deploy and exit")
    parser.add_argument("--stop", action="store_true", help="remove the application and exit")
    parser.add_argument("--address", default=None, help="Ray address (default: RAY_ADDRESS)")
    parser.add_argument("--debug", action="store_true", help="tracebacks on errors")
    args = parser.parse_args(argv)
    if not args.stop and not args.index:
        parser.error("--index is required (or --stop)")
    return args


def run(
    args: argparse.Namespace, stop_event: threading.Event | None = None, job: Job | None = None
) -> int:
    """Deploy, then wait for Ctrl-C (or ``stop_event``) unless detached."""
    job = job or Job("serve")
    from ray import serve

    from santa.files import storage
    from santa.search.serve import ServeOptions, deploy

    job.start_ray(args.address)
    if args.stop:
        serve.delete(args.name)
        print(f"removed the Serve application {args.name}")
        return 0
    options = ServeOptions(
        index=args.index if storage.is_s3(args.index) else storage.absolute(args.index),
        model=args.model,
        dim=args.dim,
        replicas=args.replicas[0],
        max_replicas=args.replicas[1],
        target_ongoing_requests=args.target_ongoing_requests,
        max_batch_size=args.max_batch_size,
        batch_wait_ms=args.batch_wait_ms,
        max_body_bytes=args.max_body_kb * 1024,
        cpus_per_replica=args.cpus_per_replica,
        gpus_per_replica=args.gpus_per_replica,
        max_ongoing_requests=args.max_ongoing_requests,
        default_k=args.top_k,
        host=args.host,
        port=args.port,
        route_prefix=args.route_prefix,
        name=args.name,
    )
    url = deploy(options)
    print(f"serving {options.index}: the page at {url}/, POST {url}/search", flush=True)
    if args.detach:
        return 0
    stop_event = stop_event or threading.Event()
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, lambda *_: stop_event.set())
    try:
        while not stop_event.wait(1.0):
            pass
    finally:
        serve.delete(options.name)
        print(f"stopped {options.name}", flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    """Parse → serve; errors as one line."""
    args = parse_args(argv)
    job = Job("serve")  # serves until stopped; reads only: no lock
    return job.main(lambda: run(args, job=job), argv)


if __name__ == "__main__":
    exit_with(main())
