"""The Horovod API's response cache at 8 ranks on the two simulated hosts (4 + 4, torchrun on each, as a user starts
a two-node job): a Horovod-style script (DistributedOptimizer, a metric allreduce, an allgather whose size changes in
the last batch of every epoch) ends with the same final weights, bitwise, with the cache on (Horovod's default) and
off (HOROVOD_CACHE_CAPACITY=0); and a rank killed in the middle of a step, cache on, ends every other rank with
Horovod's error naming the lost rank, within the stall timeout, leaving nothing running.

Both weight runs set HOROVOD_FUSION_THRESHOLD=0: which allreduces share a fused buffer depends on timing, in Horovod
and here, with or without the cache, and at 8 ranks the buffer's layout moves the last bits."""

from __future__ import annotations

import json
import subprocess
import textwrap
import time
from pathlib import Path
from typing import Dict, List

import pytest

from common import launch as launch_layer
from launched import PY, rank_exit_codes

pytestmark = pytest.mark.multinode

API = "ddp_train.horovod_api"
HOSTS = "node0:4,node1:4"
WORLD = 8
KILLED = 5
STALL_S = 30
SCRIPT = textwrap.dedent('''
    import hashlib, json, os, signal, sys, time
    import torch
    import torch.nn.functional as F
    import horovod.torch as hvd

    out, kill_rank = sys.argv[1], int(sys.argv[2])
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(),
                                *[torch.nn.Linear(16, 16) for _ in range(6)], torch.nn.Linear(16, 3))
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
                                   named_parameters=model.named_parameters())
    g = torch.Generator().manual_seed(100 + r)
    data, labels = torch.randn(38, 8, generator=g), torch.randint(0, 3, (38,), generator=g)
    report = {"rank": r, "gathered": []}
    try:
        for epoch in range(2):
            for step, start in enumerate(range(0, 38, 16)):  # the last batch of an epoch has 6 rows
                x, y = data[start:start + 16], labels[start:start + 16]
                opt.zero_grad()
                loss = F.cross_entropy(model(x), y)
                if r == kill_rank and epoch == 1 and step == 1:  # in the middle of backward
                    def die(grad):
                        with open(os.path.join(out, "killed.json"), "w") as f:
                            json.dump({"rank": r, "at": time.time()}, f)
                        os.kill(os.getpid(), signal.SIGKILL)
                    model[4].weight.register_hook(die)
                loss.backward()
                opt.step()
                report["loss"] = hvd.allreduce(loss.detach(), name="loss").item()
                report["gathered"].append(hvd.allgather(model(x).argmax(1), name="preds").shape[0])
    except hvd.HorovodInternalError as exc:
        report.update(error=str(exc), at=time.time())
        with open(os.path.join(out, f"rank{r}.json"), "w") as f:
            json.dump(report, f)
        sys.exit(1)
    report["weights"] = hashlib.sha256(b"".join(p.detach().numpy().tobytes() for p in model.parameters())).hexdigest()
    with open(os.path.join(out, f"rank{r}.json"), "w") as f:
        json.dump(report, f)
''')


def launch(cluster, folder: Path, env: Dict[str, str], kill: int = -1, port: int = 29531) -> Dict:
    """The script on both hosts (torchrun on each); what each rank wrote, and the agents' results."""
    folder.mkdir(parents=True, exist_ok=True)
    script = folder / "hvd_style.py"
    script.write_text(SCRIPT)
    cmd = launch_layer.get("torchrun").command(WORLD, [str(script), str(folder), str(kill)], module=API, python=PY,
                                               hosts=HOSTS, port=port)
    results = cluster.run_together({"node0": cmd, "node1": cmd}, timeout=300, env=env)
    ranks = {int(p.stem[4:]): json.loads(p.read_text()) for p in folder.glob("rank*.json")}
    killed = json.loads((folder / "killed.json").read_text()) if (folder / "killed.json").exists() else None
    return {"ranks": ranks, "results": results, "killed": killed, "script": script}


@pytest.fixture(scope="module")
def runs(cluster, tmp_path_factory) -> Dict[str, Dict]:
    """Three launches shared by the tests: cache on and off (fusion off in both), and cache on with a rank killed."""
    base = tmp_path_factory.mktemp("api_scale")
    fusion_off = {"HOROVOD_FUSION_THRESHOLD": "0"}
    return {"on": launch(cluster, base / "on", fusion_off, port=29531),
            "off": launch(cluster, base / "off", {**fusion_off, "HOROVOD_CACHE_CAPACITY": "0"}, port=29532),
            "killed": launch(cluster, base / "killed", {"HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": str(STALL_S)},
                             kill=KILLED, port=29533)}


def test_the_cache_changes_no_bit_of_training_at_8_ranks_on_two_hosts(runs):
    for mode in ("on", "off"):
        assert sorted(runs[mode]["ranks"]) == list(range(WORLD)), \
            "\n".join(r.output[-3000:] for r in runs[mode]["results"].values())
    weights = {mode: {got["weights"] for got in runs[mode]["ranks"].values()} for mode in ("on", "off")}
    assert len(weights["on"]) == 1 and weights["on"] == weights["off"]
    losses = {mode: {got["loss"] for got in runs[mode]["ranks"].values()} for mode in ("on", "off")}
    assert losses["on"] == losses["off"] and len(losses["on"]) == 1
    # The allgather's size changed in every epoch's last batch (6 rows a rank), and back: its entry was invalidated
    # and negotiated again each time.
    for got in runs["on"]["ranks"].values():
        assert got["gathered"] == ([16 * WORLD] * 2 + [6 * WORLD]) * 2


def test_a_rank_killed_mid_step_ends_every_other_rank_with_horovods_error_naming_it(runs):
    killed = runs["killed"]
    assert killed["killed"] is not None and killed["killed"]["rank"] == KILLED
    assert all(result.returncode != 0 for result in killed["results"].values())
    reported = killed["ranks"]
    outputs = "\n".join(r.output for r in killed["results"].values())
    # torchrun's agent stops a host's other ranks once one of them ended (SIGTERM, -15): a rank may be stopped
    # before it writes. Every other rank ends with Horovod's error, the other host's included.
    codes = {rank: code for r in killed["results"].values() for rank, code in rank_exit_codes("torchrun",
                                                                                            r.output).items()}
    assert codes[KILLED] == -9, outputs[-3000:]
    for rank in set(range(WORLD)) - {KILLED}:
        assert rank in reported or codes.get(rank) == -15, (rank, outputs[-3000:])
    assert set(reported) & {0, 1, 2, 3}, outputs[-3000:]
    for rank, got in reported.items():
        assert got["error"].startswith("Horovod has been shut down.")
        assert f"rank {KILLED} exited or lost its connection to rank 0" in got["error"]
        assert got["at"] - killed["killed"]["at"] < STALL_S, rank


def test_nothing_is_left_running_after_the_lost_rank(runs):
    time.sleep(1.0)
    left: List[str] = subprocess.run(["pgrep", "-af", str(runs["killed"]["script"])], capture_output=True,
                                     text=True).stdout.splitlines()
    assert left == []
