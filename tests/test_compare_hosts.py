"""The comparison as a cluster tool, on the simulated two-host cluster (tests/cluster.py): compare-backends
--hosts launches every run across node0 and node1 from node0; a host that drops off the network fails its
run naming the host while the others complete; a host without the project's path stops everything before
the first run; and the two-node commands of README.md, as written, train equal at world size 8."""

from __future__ import annotations

import json
import re
import shlex
import signal
import subprocess
import time
from pathlib import Path

import pytest

from cluster import on_host
from common.launch import Job
from launched import COMPARE, PY, REPO, assert_summary_leads, compare_in_process, job_env, read_run, run_cmd
from processes import assert_nothing_left, job_processes
from common.rundir.names import CONFIG_FILE, SUMMARY_FILE

pytestmark = pytest.mark.multinode

SHORT = ["--model", "mlp", "--threads", "1"]


def compare_on_node0(cluster, args, out: Path, timeout: float = 400, cwd: Path = REPO):
    """compare-backends started on node0, as a user logged in there would start it."""
    return run_cmd(on_host("node0", [*COMPARE, *args, "--out", str(out)]), timeout=timeout, cwd=cwd)


def test_compare_runs_every_backend_across_both_hosts(across_hosts):
    result, out, summary = across_hosts  # conftest.py: shared with test_multinode
    runs = {r["name"]: r for r in summary["runs"]}
    differ = any(not p["bitwise_identical"] for p in summary["parity"] if p["kind"] == "backends")
    # The noise floor's run (DDP again, one ulp off, placed like the others) only when the backends differ.
    floor = ["ddp+perturbed1@4#1"] if differ else []
    assert sorted(runs) == sorted(["ddp@4#1", "horovod-gloo@4#1", "horovod-mpi@4#1"] + floor)
    for run in runs.values():
        config = json.loads((Path(run["path"]) / CONFIG_FILE).read_text())
        assert sorted(config["rank_hosts"]) == ["node0", "node0", "node1", "node1"], run["name"]
        assert run["launch"]["placement"] == "node0:2,node1:2"
    # torchrun was started on each host; Horovod once, from node0.
    assert set(runs["ddp@4#1"]["launch"]["commands"]) == {"node0", "node1"}
    assert runs["horovod-gloo@4#1"]["launch"]["commands"]["here"].split()[1:5] == ["-np", "4", "-H", "node0:2,node1:2"]
    report = (out / "report.md").read_text()
    assert_summary_leads(out)
    for host in ("node0", "node1"):
        assert re.search(rf"`{host}\$ \S*torchrun --nnodes 2 --nproc-per-node 2 --rdzv-backend c10d "
                         r"--rdzv-endpoint node0:\d+ ", report), "the reproduce table gives each host's command"
    assert "**Across hosts**" in report and "**On one host**" not in report
    assert all("across 2 hosts (node0, node1)" in v["verdict"] for v in summary["speed"])
    verdicts = [p["verdict"] for p in summary["parity"] if p["kind"] == "backends"]
    assert len(verdicts) == 3 and all(v == "bitwise identical" or v.startswith("equal within") for v in verdicts)


def test_host_that_drops_off_fails_its_run_naming_it_and_the_others_complete(cluster, tmp_path):
    timeout_s = 20
    out = tmp_path / "out"
    cmd = on_host("node0", [*COMPARE, "--hosts", "node0:1,node1:1", "--np", "2", "--backends", "ddp,horovod",
                            "--hvd-controllers", "gloo", "--repeats", "1", "--explain", "none", *SHORT,
                            "--max-steps", "60", "--log-every", "5", "--timeout", str(timeout_s),
                            "--rdzv-port", "29530", "--out", str(out)])
    proc = subprocess.Popen(cmd, cwd=REPO, env=job_env(), text=True, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT)
    lines, link_down_at, failed_after = [], None, None
    try:
        for line in proc.stdout:
            lines.append(line)
            if link_down_at is None and re.search(r"ddp@2#1 epoch 1 step \d+", line):
                cluster.set_link("node1", up=False)  # node1 drops off the network mid-run
                link_down_at = time.monotonic()
            if link_down_at is not None and failed_after is None and "finished ddp@2#1" in line:
                failed_after = time.monotonic() - link_down_at
                cluster.set_link("node1", up=True)
        proc.wait(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
        cluster.set_link("node1", up=True)
        cluster.wait_for_ssh("node1")
    output = "".join(lines)
    assert link_down_at is not None and failed_after is not None, output[-4000:]
    assert proc.returncode == 1, output[-4000:]
    # Within --timeout (the collective's own, then the liveness check that names the host) plus a margin.
    assert failed_after < timeout_s + 15, f"the run took {failed_after:.0f} s to fail after the link went down"
    summary = json.loads((out / SUMMARY_FILE).read_text())
    failure, = summary["failures"]
    assert failure["name"] == "ddp@2#1"
    assert re.search(r"ranks? [\d, ]+\(node1\) stopped taking part", failure["error"]), failure["error"]
    assert [r["name"] for r in summary["runs"]] == ["horovod-gloo@2#1"], "the next run completes"
    assert f"**FAILED** ddp@2#1: {failure['error']}" in (out / "report.md").read_text()


def test_ctrl_c_stops_the_run_on_every_host(cluster, tmp_path):
    out = tmp_path / "interrupted"
    cmd = on_host("node0", [*COMPARE, "--hosts", "node0:1,node1:1", "--np", "2", "--backends", "ddp",
                            "--repeats", "1", *SHORT, "--epochs", "100000", "--log-every", "5",
                            "--rdzv-port", "29550", "--out", str(out)])
    with Job(cmd, env=job_env(), cwd=REPO) as job:
        assert job.wait_for(r"ddp@2#1 epoch 1 step \d+", timeout=120), job.output[-3000:]
        assert job_processes(str(out)), "ranks run on both hosts"
        job.send_signal(signal.SIGINT)
        assert job.wait(timeout=60) == 130, job.output[-3000:]
    assert "interrupted; the running job was stopped" in job.output
    # torchrun on node1, started over ssh, ends with its ranks when its terminal closes.
    assert_nothing_left(str(out), within=20)


def test_host_without_the_project_path_stops_everything_before_the_first_run(cluster, tmp_path):
    project = tmp_path / "project"  # where the user runs from: present on node0, not on node1
    project.mkdir()
    cluster.stop_sshd("node1")
    cluster.start_sshd("node1", hide=tmp_path)
    try:
        cluster.wait_for_ssh("node1")
        started = time.monotonic()
        result = compare_on_node0(cluster, ["--hosts", "node0:2,node1:2", "--np", "4", *SHORT], project / "out",
                                  timeout=120, cwd=project)
        seconds = time.monotonic() - started
    finally:
        cluster.stop_sshd("node1")
        cluster.start_sshd("node1")
        cluster.wait_for_ssh("node1")
    assert result.returncode == 2, result.output[-3000:]
    finding = next(line for line in result.output.splitlines() if "paths on node1" in line)
    assert re.search(rf"FAIL\s+paths on node1\s+node1 has no {re.escape(str(project))}\s+fix: install the project at "
                     r"the same path on every host", finding), finding
    assert result.output.strip().splitlines()[-1].startswith("compare-backends: error: the launch doctor found")
    assert not (project / "out").exists(), "nothing was launched"
    assert seconds < 60


def readme_two_node_commands():
    """The two-node quick start of README.md: host -> command, for torchrun and for horovodrun."""
    block = (REPO / "README.md").read_text().split("### Two nodes", 1)[1].split("```", 2)[1]
    torchrun = {m.group(1): shlex.split(m.group(2)) for m in re.finditer(r"^(node\d)\$ (torchrun .*)$", block, re.M)}
    horovodrun = next(shlex.split(m.group(1)) for m in re.finditer(r"^node0\$ (horovodrun .*)$", block, re.M))
    return torchrun, horovodrun


def test_readme_two_node_commands_train_equal_at_world_size_8_with_the_cause_measured(cluster, tmp_path):
    torchrun, horovodrun = readme_two_node_commands()
    assert horovodrun[:6] == ["horovodrun", "-np", "8", "-H", "node0:4,node1:4", "python"], horovodrun
    assert set(torchrun) == {"node0", "node1"} and torchrun["node0"] == torchrun["node1"]
    assert torchrun["node0"][:5] == ["torchrun", "--nnodes", "2", "--nproc-per-node", "4"]
    short = [*SHORT, "--max-steps", "8"]
    dirs = {name: tmp_path / name for name in ("ddp", "horovod", "horovod-predivide")}
    results = cluster.run_together({host: [*cmd, *short, "--run-dir", str(dirs["ddp"])]
                                    for host, cmd in torchrun.items()}, timeout=300)
    for result in results.values():
        result.check()
    cluster.run("node0", [*horovodrun, *short, "--run-dir", str(dirs["horovod"])], timeout=300).check()
    # The run that measures the cause: Horovod dividing before the sum, as DDP does.
    cluster.run("node0", [*horovodrun, *short, "--predivide", "--run-dir", str(dirs["horovod-predivide"])],
                timeout=300).check()
    for path in dirs.values():
        assert sorted(set(read_run(path)["config"]["rank_hosts"])) == ["node0", "node1"]
    out = tmp_path / "report"
    result = compare_in_process("--runs", *dirs.values(), "--out", out)
    assert result.returncode == 0, result.output[-3000:]
    summary = json.loads((out / SUMMARY_FILE).read_text())
    pair, = [p for p in summary["parity"] if p["kind"] == "backends"]
    assert pair["world_size"] == 8
    assert pair["verdict"] == "bitwise identical" or pair["verdict"].startswith("equal within"), pair["verdict"]
    if not pair["bitwise_identical"]:
        why, = summary["explanations"]
        assert "dividing before the sum as DDP does (horovod-" in why["text"], why["text"]
        assert f"Why, measured: {why['text']}" in (out / "report.md").read_text()


def test_allreduce_benchmark_across_hosts_reports_bus_bandwidth_against_the_link(cluster, tmp_path):
    out = tmp_path / "allreduce"
    cluster.run("node0", [PY, "-m", "benchmarks.allreduce", "--hosts", "node0:1,node1:1", "--np", "2",
                          "--backends", "torch,mpi", "--min-bytes", "4", "--max-bytes", "64K", "--iters", "2",
                          "--copy-bytes", "4M", "--out", str(out)], timeout=240).check()
    report = json.loads((out / "allreduce.json").read_text())
    link = report["link"]
    assert (link["interface"], link["to"]) == ("eth0", "node1") and link["speed_Mbps"] > 0
    assert link["GBps"] == pytest.approx(link["speed_Mbps"] / 8000)
    assert [s["name"] for s in report["series"]] == ["torch-gloo", "mpi"]
    for series in report["series"]:
        assert series["placement"] == "node0:1,node1:1"
        for row in series["results"]:
            assert row["busbw_of_link"] == pytest.approx(row["busbw_GBps"] / link["GBps"])
    # torchrun was started on both hosts (node1's over ssh).
    assert re.search(r"node0\$ \S*torchrun .*; node1\$ \S*torchrun ", report["series"][0]["command"])
