"""horovod.spark.run on a standalone Spark cluster of the two simulated hosts (tests/cluster.py): a master on node0 and
a worker of one core on each host, the driver on node0. TorchDistributor runs barrier tasks, one rank on each host;
every rank's result comes back in rank order, bitwise equal to the same function under horovodrun -np 2 --gloo; a
rank's exception on the other host is the driver's, naming it, with no worker left; a third rank for two slots is one
line once start_timeout has passed."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from typing import Dict, Iterator, List

import pyspark
import pytest

import engine_drivers
from cluster import on_host
from engine_drivers import ENGINE_ENV, check_failure, results
from launched import PY, REPO, job_env

pytestmark = [pytest.mark.multinode, pytest.mark.timeout(900)]

SPARK_CLASS = str(Path(pyspark.__file__).parent / "bin" / "spark-class")
MASTER_PORT = 7077


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="module")
def spark_cluster(cluster, tmp_path_factory) -> Iterator[str]:
    """The master's URL, once a worker on each host has registered with it."""
    logs = tmp_path_factory.mktemp("spark-cluster")
    master_host = cluster.addresses["node0"]
    url = f"spark://{master_host}:{MASTER_PORT}"
    procs: List[subprocess.Popen] = []

    def start(host: str, name: str, args: List[str]) -> None:
        env = {**ENGINE_ENV, "SPARK_LOCAL_IP": cluster.addresses[host], "SPARK_NO_DAEMONIZE": "1"}
        with open(logs / f"{name}.log", "wb") as log:
            procs.append(subprocess.Popen(on_host(host, [SPARK_CLASS, *args]), stdout=log, stderr=log,
                                          stdin=subprocess.DEVNULL, env=job_env(env), cwd=REPO))

    try:
        start("node0", "master", ["org.apache.spark.deploy.master.Master", "--host", master_host, "--port",
                                  str(MASTER_PORT), "--webui-port", "8080"])
        for host in cluster.hosts:
            start(host, f"worker-{host}", ["org.apache.spark.deploy.worker.Worker", "--host", cluster.addresses[host],
                                           "--cores", "1", "--memory", "2g", "--webui-port", "8081",
                                           "--work-dir", str(logs / f"work-{host}"), url])
        deadline = time.monotonic() + 240
        while (logs / "master.log").read_text(errors="replace").count("Registering worker") < 2:
            assert time.monotonic() < deadline and all(p.poll() is None for p in procs), \
                "the Spark cluster did not start:\n" + "\n".join(
                    f"--- {f.name}\n{f.read_text(errors='replace')[-2000:]}" for f in sorted(logs.glob("*.log")))
            time.sleep(0.5)
        yield url
    finally:
        for proc in reversed(procs):
            _stop(proc)


@pytest.fixture(scope="module")
def on_cluster(spark_cluster, cluster, runs, tmp_path_factory) -> Dict:
    folder = tmp_path_factory.mktemp("cluster-driver")
    engine_drivers.write(folder)
    reference = engine_drivers.horovodrun_reference(runs, folder)
    env = {**ENGINE_ENV, "SPARK_LOCAL_IP": cluster.addresses["node0"]}
    pids = folder / "pids"
    pids.mkdir()
    out = cluster.run("node0", [PY, "-m", "ddp_train.horovod_api", str(folder / "spark_driver.py"), spark_cluster, "2",
                                str(pids)], timeout=600, env=env).check()
    return {"reference": reference, "found": results(out.output), "pids": pids}


def test_spark_run_on_a_standalone_cluster_puts_one_rank_on_each_host(on_cluster):
    train = on_cluster["found"]["train"]
    assert [r["rank"] for r in train] == [0, 1] and all(r["size"] == 2 for r in train)
    assert sorted(r["host"] for r in train) == ["node0", "node1"]
    assert train[0]["sha256"] == train[1]["sha256"] == on_cluster["reference"]["sha256"]


def test_a_rank_that_raises_on_another_host_is_named_and_no_worker_is_left(on_cluster):
    check_failure(on_cluster["found"], on_cluster["pids"], "horovod.spark.run")


def test_more_ranks_than_the_clusters_slots_is_one_line_after_start_timeout(on_cluster):
    assert on_cluster["found"]["too_many"] == (
        "horovod.spark.run: num_proc=3 is more than the 2 task slots of this Spark cluster after waiting "
        "start_timeout=2 s; each Horovod process runs in a Spark task: lower num_proc or give Spark more cores "
        "(local[N], or more executors)")
