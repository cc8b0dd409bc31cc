"""The launch doctor, on this machine alone and on the simulated two-host cluster (tests/cluster.py)."""

from __future__ import annotations

import re
import socket
import subprocess

import pytest

from cluster import on_host
from launched import PY, run_cmd

DOCTOR = [PY, "-m", "common.doctor"]
HOSTS = "node0:2,node1:2"


def free_port() -> int:
    """A port nothing on this host listens on right now."""
    with socket.socket() as sock:
        sock.bind(("", 0))
        return sock.getsockname()[1]


def lines(output: str, status: str) -> list:
    """The check lines with this status (PASS, FAIL, SKIP)."""
    return [line for line in output.splitlines() if line.startswith(status + " ")]


def test_all_checks_pass_on_this_machine():
    port = free_port()
    result = run_cmd(DOCTOR + ["--port", str(port)], timeout=120)
    assert result.returncode == 0, result.output
    passed = "\n".join(lines(result.output, "PASS"))
    assert not lines(result.output, "FAIL")
    assert re.search(r"horovod build\s+horovod 0\.28\.1 with PyTorch, Gloo, MPI", passed), result.output
    assert re.search(r"mpi4py vs mpirun\s+both Open MPI \d", passed), result.output
    assert f"port {port} on {socket.gethostname()}" in passed
    assert "single host" in passed
    assert re.search(r"allreduce\s+4 MB x 5 over 2 processes on localhost: [\d.]+ GB/s", passed), result.output
    assert "doctor: all 5 checks passed" in result.output


def test_port_in_use_fails_naming_the_holder_and_the_fix():
    with socket.socket() as held:
        held.bind(("", 0))
        held.listen()
        port = held.getsockname()[1]
        result = run_cmd(DOCTOR + ["--port", str(port), "--no-allreduce"], timeout=60)
    assert result.returncode == 1, result.output
    fails = lines(result.output, "FAIL")
    assert len(fails) == 1, result.output
    fail = fails[0]
    assert f"port {port} on {socket.gethostname()}" in fail and "Address already in use" in fail
    assert re.search(r"held by pid \d+ \(python", fail), fail
    assert re.search(r"fix: .*--port N.*--rdzv-endpoint", result.output), result.output


def test_bad_host_list_is_one_line_exit_2():
    result = run_cmd(DOCTOR + ["-H", "node0:x"], timeout=30)
    assert result.returncode == 2
    assert result.output.strip().splitlines()[-1].endswith(
        "error: bad host entry 'node0:x' in -H 'node0:x'; write host:slots, e.g. node0:4,node1:4")


@pytest.mark.multinode
def test_all_checks_pass_across_two_hosts(cluster):
    # The ssh options horovodrun has, passed to ssh and to the probe's horovodrun (the hosts' ssh config
    # already names this key; the options must not get in its way).
    ssh = ["--ssh-port", "22", "--ssh-identity-file", "/etc/ssh/id_ed25519"]
    result = cluster.run("node0", DOCTOR + ["-H", HOSTS, "--port", "29500", *ssh], timeout=120)
    assert result.returncode == 0, result.output
    passed = "\n".join(lines(result.output, "PASS"))
    assert re.search(r"ssh node1\s+passwordless login", passed), result.output
    assert "ssh node0" not in result.output, "this host is not checked over ssh"
    assert "port 29500 on node0" in passed and "port 29500 on node1" in passed
    assert re.search(r"network interface\s+eth0 \(10\.213\.77\.1\) reaches node1 \(10\.213\.77\.2\)", passed)
    assert re.search(r"allreduce\s+4 MB x 5 over 2 processes on node0, node1: [\d.]+ GB/s", passed), result.output


@pytest.mark.multinode
def test_port_in_use_on_the_other_host_fails(cluster):
    listener = subprocess.Popen(on_host("node1", [
        PY, "-c", "import socket, time; s = socket.socket(); s.bind(('', 29501)); s.listen(); print('up', flush=True); "
                  "time.sleep(60)"]), stdout=subprocess.PIPE, text=True)
    try:
        assert listener.stdout.readline().strip() == "up"
        result = cluster.run("node0", DOCTOR + ["-H", HOSTS, "--port", "29501", "--no-allreduce"], timeout=60)
    finally:
        listener.kill()
        listener.wait()
    assert result.returncode == 1, result.output
    fails = lines(result.output, "FAIL")
    assert len(fails) == 1, result.output
    fail = fails[0]
    assert "port 29501 on node1" in fail and "Address already in use" in fail
    assert "port 29501 on node0" in "\n".join(lines(result.output, "PASS"))


@pytest.mark.multinode
@pytest.mark.parametrize("how", ["sshd stopped", "link down"])
def test_host_down_fails_fast_naming_it(cluster, how):
    if how == "sshd stopped":
        cluster.stop_sshd("node1")
    else:
        cluster.set_link("node1", up=False)
    try:
        # A hang would overrun this timeout and fail the test.
        result = cluster.run("node0", DOCTOR + ["-H", HOSTS, "--port", "29500"], timeout=45)
    finally:
        if how == "sshd stopped":
            cluster.start_sshd("node1")
        else:
            cluster.set_link("node1", up=True)
        cluster.wait_for_ssh("node1")
    assert result.returncode == 1, result.output
    fails = lines(result.output, "FAIL")
    assert len(fails) == 1, result.output
    fail = fails[0]
    assert fail.startswith("FAIL  ssh node1")
    # A host whose link is down answers nothing: ARP fails ("No route to host") or ssh's ConnectTimeout ends it.
    error, fix = {"sshd stopped": ("Connection refused", "nothing listens for ssh on node1: start sshd there"),
                  "link down": ("No route to host|timed out", "node1 is down or unreachable")}[how]
    assert re.search(error, fail), result.output
    assert f"fix: {fix}" in result.output
    assert re.search(r"SKIP  allreduce\s+not run: ssh node1 failed", result.output), result.output
    assert "PASS  horovod build" in result.output
