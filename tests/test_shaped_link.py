"""The link between the simulated hosts shaped with tc (common.launch.link): a run across both hosts goes through the
token buckets at both ends, and the link is clean after it, and after a block that failed; where CAP_NET_ADMIN is
missing, shaping is refused in one line and nothing is left shaped."""

from __future__ import annotations

import subprocess
import sys

import pytest

from common import launch as launch_layer
from common.compare import forecast
from launched import PY, REPO, command_on_hosts, read_run
from settings import ACROSS_HOSTS
from common.launch.link import SETTINGS, End, LinkSetting, bucket_options, root_queue, sent_bytes, shaped
from common.launch.simulated import HOSTS, link_ends

pytestmark = pytest.mark.multinode

ENDS = link_ends()
#: slow enough that the run's traffic waits in the buckets, fast enough that ten steps of a small model take seconds
SLOW = LinkSetting("50mbit", 50e6)


def overlimits(end: End) -> int:
    """How many times `end`'s bucket held a packet back (tc's own counter)."""
    import json

    done = subprocess.run(end.command("-s", "-j", "qdisc", "show", "dev", end.interface), capture_output=True,
                          text=True, check=True)
    return sum(int(q.get("overlimits", 0)) for q in json.loads(done.stdout) if q.get("root"))


def test_a_run_across_hosts_goes_through_the_buckets_and_the_link_is_clean_after(cluster, tmp_path):
    run_dir = tmp_path / "run"
    # Enough weights that a step's exchange exceeds the bucket's depth, so the bucket holds packets back.
    cmd = command_on_hosts("torchrun", 2, "node0:1,node1:1", [*ACROSS_HOSTS, "--model-arg", "hidden=4096",
                                                               "--run-dir", str(run_dir)])
    with shaped(ENDS, SLOW):
        assert [root_queue(end) for end in ENDS] == ["tbf", "tbf"]
        for result in cluster.run_together({host: cmd for host in HOSTS}, timeout=240).values():  # an agent a host
            result.check()
        sent = [sent_bytes(end) for end in ENDS]
        held = [overlimits(end) for end in ENDS]
    assert read_run(run_dir)["summary"]["steps"] == 10
    assert all(bytes_ > 1_000_000 for bytes_ in sent), f"the run's traffic did not go through both buckets: {sent}"
    assert all(count > 0 for count in held), f"no bucket held a packet back at {SLOW.describe()}: {held}"
    assert [root_queue(end) for end in ENDS] == ["noqueue", "noqueue"]


#: a user's DDP script and its Horovod twin: 1.1 MB of gradients a step, little compute
SCRIPT = """
import sys
import torch
import torch.nn.functional as F
HOROVOD = sys.argv[1] == "horovod"
if HOROVOD:
    import horovod.torch as hvd
    hvd.init()
else:
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    dist.init_process_group("gloo")
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 10))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
if HOROVOD:
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
else:
    model = DDP(model)
x, y = torch.randn(32, 256), torch.randint(10, (32,))
for _ in range(12):
    optimizer.zero_grad()
    F.cross_entropy(model(x), y).backward()
    optimizer.step()
"""


def probed_summary(cluster, folder, name: str) -> dict:
    """Run SCRIPT across the hosts under the probe (its Horovod twin on the API); its summary.json."""
    script = folder / "train.py"
    script.write_text(SCRIPT)
    run_dir = folder / name
    probe = ["--run-dir", str(run_dir), *(["--api", "horovod"] if name.startswith("horovod") else []), str(script),
             name.split("-")[0]]
    cmd = launch_layer.get("torchrun").command(2, probe, module="common.probe", python=PY, hosts="node0:1,node1:1")
    for result in cluster.run_together({host: cmd for host in HOSTS}, timeout=240).values():
        result.check()
    return read_run(run_dir)["summary"]


def test_a_probed_scripts_wait_on_a_slow_link_is_exposed_communication_not_compute(cluster, tmp_path):
    # DDP waits for its last buckets inside backward(), Horovod's optimizer in step() (synchronize): the probe
    # counts both as communication; the compute stays what it was on the free link
    for backend in ("ddp", "horovod"):
        free_run = probed_summary(cluster, tmp_path, f"{backend}-free")
        with shaped(ENDS, SLOW):
            slow_run = probed_summary(cluster, tmp_path, f"{backend}-slow")
        free, slow = free_run["time_split"], slow_run["time_split"]
        # what a forecast needs: the bytes of the step's gradients (273,418 float32), and from them the free run's
        # forecast of the slow link's step lands near the step measured there
        assert free_run["reduced_bytes_per_step"] == 4 * 273_418
        measured = forecast.Measured.of(free_run)
        assert measured is not None and measured.backend == ("horovod-api" if backend == "horovod" else "ddp")
        assert forecast.step_s(measured, forecast.Link(SLOW.rate_bits)) * 1e3 == pytest.approx(slow["step_ms"],
                                                                                                rel=0.15)
        # 1.1 MB each way at 50 Mbit/s: at least 150 ms a step on the wire, and nine tenths of what the link added
        # to the step is called communication
        added = slow["comm_ms"] - free["comm_ms"]
        assert added > 100, (backend, free, slow)
        assert slow["compute_ms"] - free["compute_ms"] < 0.1 * added, (backend, free, slow)
        assert abs(slow["data_ms"] + slow["compute_ms"] + slow["comm_ms"] - slow["step_ms"]) < 1e-6
    assert [root_queue(end) for end in ENDS] == ["noqueue", "noqueue"]


def test_a_block_that_fails_leaves_the_link_clean(cluster):
    with pytest.raises(subprocess.CalledProcessError):
        with shaped(ENDS, SETTINGS["1gbit"]):
            assert root_queue(ENDS[0]) == "tbf"
            subprocess.run([sys.executable, "-c", "raise SystemExit(3)"], check=True)
    assert [root_queue(end) for end in ENDS] == ["noqueue", "noqueue"]


def test_without_cap_net_admin_shaping_is_one_line_and_nothing_is_shaped(cluster):
    attempt = ("from common.launch.link import End, SETTINGS, ShapingRefused, shape\n"
               "try:\n    shape(End(None, 'eth0'), SETTINGS['1gbit'])\n"
               "except ShapingRefused as refused:\n    print(refused)\n")
    done = subprocess.run(["ip", "netns", "exec", "node0", "setpriv", "--bounding-set=-net_admin",
                           "--inh-caps=-net_admin", PY, "-c", attempt], capture_output=True, text=True, cwd=REPO,
                          timeout=60)
    lines = done.stdout.strip().splitlines()
    assert done.returncode == 0 and len(lines) == 1, done.stdout + done.stderr
    assert "cannot shape eth0 to 1 Gbit/s: tc needs CAP_NET_ADMIN" in lines[0] and "--cap-add NET_ADMIN" in lines[0]
    assert root_queue(ENDS[0]) == "noqueue"


def test_the_buckets_hold_a_segment_and_a_millisecond_of_the_rate():
    assert bucket_options(1e9) == ["rate", "1000000000bit", "burst", str(256 * 1024), "latency", "100ms"]
    assert bucket_options(10e9)[3] == str(1_250_000)
    assert [s.describe() for s in SETTINGS.values()] == ["unshaped", "10 Gbit/s", "1 Gbit/s"]
    assert SLOW.describe() == "50 Mbit/s"
