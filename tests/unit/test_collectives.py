"""The collectives alone: the identity in one process, and the real thing on a 2-rank gloo group on loopback."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap

import torch

from azext_elastictrain.runtime.collectives import Collectives

RANK_SCRIPT = textwrap.dedent("""
    import json, sys
    import torch.distributed as dist
    from azext_elastictrain.runtime.collectives import Collectives

    dist.init_process_group("gloo", timeout=__import__("datetime").timedelta(seconds=60))
    ranks = Collectives()
    rank = ranks.rank
    out = {
        "rank": rank, "world_size": ranks.world_size, "distributed": ranks.distributed,
        "gathered": ranks.all_gather({"rank": rank, "token": f"t{rank}"}),
        "broadcast": ranks.broadcast(["from", rank]),
        "max": ranks.all_reduce_max([rank, 1 - rank, 7]),
    }
    own = b"holder-bytes-" + bytes(range(50)) if rank == 1 else None
    got = ranks.broadcast_bytes(own, src=1)
    out["bytes"] = bytes(got).hex()
    out["bytes_is_own"] = got is own
    import torch
    tensor = torch.full((3,), float(rank))
    ranks.broadcast_tensor(tensor, src=1)
    out["tensor"] = tensor.tolist()
    dist.destroy_process_group()
    print("RESULT " + json.dumps(out))
""")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_one_process_without_a_process_group_is_the_identity() -> None:
    ranks = Collectives()
    assert (ranks.distributed, ranks.rank, ranks.world_size) == (False, 0, 1)
    assert ranks.all_gather("x") == ["x"]
    assert ranks.broadcast({"a": 1}) == {"a": 1}
    assert ranks.all_reduce_max([3, 1]) == [3, 1]
    own = b"abc"
    assert ranks.broadcast_bytes(own, src=0) is own
    tensor = torch.ones(2)
    ranks.broadcast_tensor(tensor, src=0)
    assert tensor.tolist() == [1.0, 1.0]


def test_two_ranks_on_gloo_gather_broadcast_reduce_and_share_bytes() -> None:
    port = free_port()
    procs = []
    for rank in range(2):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                   GLOO_SOCKET_IFNAME="lo")
        procs.append(subprocess.Popen([sys.executable, "-c", RANK_SCRIPT], env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True))
    results = {}
    for proc in procs:
        out, err = proc.communicate(timeout=180)
        assert proc.returncode == 0, err[-3000:]
        line = next(line for line in out.splitlines() if line.startswith("RESULT "))
        result = json.loads(line[len("RESULT "):])
        results[result["rank"]] = result
    expected_bytes = (b"holder-bytes-" + bytes(range(50))).hex()
    for rank, result in results.items():
        assert result["world_size"] == 2 and result["distributed"] is True
        assert result["gathered"] == [{"rank": 0, "token": "t0"}, {"rank": 1, "token": "t1"}]
        assert result["broadcast"] == ["from", 0]
        assert result["max"] == [1, 1, 7]
        assert result["bytes"] == expected_bytes
        assert result["bytes_is_own"] is (rank == 1)  # the holder sends its own bytes, without a copy
        assert result["tensor"] == [1.0, 1.0, 1.0]
