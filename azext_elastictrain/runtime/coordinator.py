"""The coordinator of an in-process job: the service every node asks, at each step, which nodes train together.

    python -m azext_elastictrain.runtime.coordinator --bind 0.0.0.0:29510 --min-replicas 1

It is torchft's Lighthouse (``torchft.coordination.LighthouseServer``, public) with the settings ``job run`` gives
it (core/launch.py ``coordinator_args``: short waits, so a lost node is dropped and a newcomer admitted within a
step or two). torchft's own ``torchft_lighthouse`` takes the same settings, but it names the machine rather than
the address it was bound to (a local job's nodes must reach it on loopback) and dies of SIGTERM instead of
stopping; this module binds, says where it listens (stdout, and ``--address-file`` written once it listens, for
the local backend to read), and exits 0 on SIGTERM or SIGINT (a Deployment's pod deleted, a local job deleted).

It holds no training state: a coordinator that restarts forms the next quorum from the nodes' heartbeats.
"""
from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from pathlib import Path

from azext_elastictrain.core import launch

_WILDCARDS = ("", "0.0.0.0", "[::]", "::")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m " + launch.COORDINATOR_MODULE,
                                     description="The quorum service of an in-process job (torchft's Lighthouse).")
    parser.add_argument("--bind", default=f"0.0.0.0:{launch.COORDINATOR_PORT}",
                        help="HOST:PORT to listen on; port 0: a free one (default: %(default)s)")
    parser.add_argument("--min-replicas", type=_at_least_one, default=1,
                        help="the fewest nodes a quorum takes (the job's --min-nodes)")
    parser.add_argument("--join-timeout-ms", type=_at_least_one, required=True,
                        help="how long a quorum waits for a node that is heard but has not asked (the backend's)")
    parser.add_argument("--quorum-tick-ms", type=_at_least_one, default=launch.COORDINATOR_QUORUM_TICK_MS)
    parser.add_argument("--heartbeat-timeout-ms", type=_at_least_one, required=True,
                        help="drop a node unheard of this long (the backend's: core/launch.py LaunchProfile)")
    parser.add_argument("--address-file", type=Path, help="write the address here once listening")
    return parser.parse_args(argv)


def _at_least_one(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


def reachable_address(bind: str, served: str) -> str:
    """The URL nodes use: the bound host with the port the server got (``served`` names the machine, which
    may not resolve to the address bound, e.g. loopback), or ``served`` where it was bound to every address."""
    host = bind.rpartition(":")[0]
    port = served.rstrip("/").rpartition(":")[2]
    return served if host in _WILDCARDS else f"http://{host}:{port}"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    from torchft.coordination import LighthouseServer  # imports torch: after the arguments are checked

    server = LighthouseServer(bind=args.bind, min_replicas=args.min_replicas, join_timeout_ms=args.join_timeout_ms,
                              quorum_tick_ms=args.quorum_tick_ms, heartbeat_timeout_ms=args.heartbeat_timeout_ms)
    try:
        address = reachable_address(args.bind, server.address())
        if args.address_file is not None:  # whole or not at all: a reader never sees half an address
            partial = args.address_file.with_name(args.address_file.name + ".partial")
            partial.write_text(address + "\n", encoding="utf-8")
            os.replace(partial, args.address_file)
        print(f"coordinator listening on {address} (min replicas {args.min_replicas}, join timeout "
              f"{args.join_timeout_ms} ms, quorum tick {args.quorum_tick_ms} ms, heartbeat timeout "
              f"{args.heartbeat_timeout_ms} ms)", flush=True)
        stop.wait()
    finally:
        server.shutdown()
    print("coordinator stopped", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
