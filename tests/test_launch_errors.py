"""Launch problems end in seconds with a message that names them: a port in use, more processes than
slots, data files that cannot be read. A one-host job listens on loopback only, jobs started from several
threads at once each find their launcher, Open MPI jobs the suite starts at once keep their session
directories apart, and torchrun leaves no log folders behind."""

from __future__ import annotations

import re
import signal
import socket
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from datasets import write_cifar10, write_mnist
from launched import BIN, PY, launch, run_cmd
from processes import Job, assert_nothing_left, worker
from common.launch.jobs import OPEN_MPI_SESSIONS, TORCHRUN_LOGS
from common.rundir.names import CONFIG_FILE

TINY = ["--model", "mlp", "--max-steps", "3", "--threads", "1"]


@pytest.fixture
def busy_port():
    """A TCP port some other program is listening on."""
    with socket.socket() as holder:
        holder.bind(("0.0.0.0", 0))
        holder.listen(1)
        yield holder.getsockname()[1]


def test_torchrun_master_port_in_use(tmp_path, busy_port):
    run_dir = tmp_path / "run"
    result = run_cmd([str(BIN / "torchrun"), "--nproc-per-node=2", f"--master-port={busy_port}",
                      "-m", "ddp_train", *TINY, "--run-dir", str(run_dir)], timeout=60)
    assert result.returncode != 0
    assert result.seconds < 30
    assert "EADDRINUSE" in result.output or "address already in use" in result.output, result.output[-2000:]
    assert_nothing_left(str(run_dir))


def test_ddp_store_port_in_use_is_one_line(tmp_path, busy_port):
    """Without torchrun (srun, or RANK/WORLD_SIZE by hand) rank 0 hosts the store at MASTER_PORT."""
    env = {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2",
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(busy_port)}
    result = run_cmd([PY, "-m", "ddp_train", *TINY, "--run-dir", str(tmp_path)], timeout=60, env=env)
    assert result.returncode == 2
    assert result.seconds < 20
    assert f"[rank 0] ddp_train: error: MASTER_PORT {busy_port} is already in use on this host; export a free " \
           "MASTER_PORT" in result.output, result.output[-2000:]
    assert "Traceback" not in result.output


def test_horovodrun_more_processes_than_slots(tmp_path):
    result = run_cmd([str(BIN / "horovodrun"), "-np", "4", "-H", "localhost:2", "--gloo", PY, "-m", "hvd_train",
                      *TINY, "--run-dir", str(tmp_path)], timeout=60)
    assert result.returncode != 0 and result.seconds < 30
    assert "Requested more processes (4) than there are available slots (2)" in result.output, result.output[-2000:]
    assert not (tmp_path / CONFIG_FILE).exists()


def test_mpirun_more_processes_than_slots(tmp_path):
    from hvd_train.launch import mpi_flags

    root = [f for f in mpi_flags() if f != "--oversubscribe"]
    result = run_cmd(["mpirun", *root, "--host", "localhost:1", "-np", "2", PY, "-m", "hvd_train", *TINY,
                      "--run-dir", str(tmp_path)], timeout=60)
    assert result.returncode != 0 and result.seconds < 30
    assert "not enough slots" in result.output, result.output[-2000:]


# Each reader under one launcher of each backend: the error comes from the shared reader, not the launcher.
@pytest.mark.parametrize("launcher,dataset,writer,spoil", [
    ("torchrun", "mnist", write_mnist, lambda root: _truncate(root / "MNIST" / "raw" / "train-images-idx3-ubyte")),
    ("mpirun", "cifar10", write_cifar10,
     lambda root: (root / "cifar-10-batches-py" / "data_batch_3").write_bytes(b"\x00junk")),
])
def test_unreadable_data_files_fail_fast_on_every_rank(tmp_path, launcher, dataset, writer, spoil):
    root = writer(tmp_path / "data")
    spoil(root)
    result = launch(launcher, 2, ["--dataset", dataset, "--data-dir", str(root), *TINY,
                                  "--run-dir", str(tmp_path / "run")], timeout=90)
    # mpirun waits odls_base_sigkill_timeout (5 s) twice after a rank fails, however fast the ranks end.
    assert result.returncode != 0 and result.seconds < 45
    for rank in range(2):
        line = re.search(rf"\[rank {rank}\] (ddp|hvd)_train: error: cannot read .*--data-dir.*", result.output)
        assert line, result.output[-3000:]
    assert not re.search(r'File ".*/(common|ddp_train|hvd_train)/', result.output)


def _truncate(path):
    path.write_bytes(path.read_bytes()[:100])


LOOPBACK = ("127.0.0.1", "[::1]", "[::ffff:127.0.0.1]")


def _listening_addresses(pid: int, host=None):
    """The local addresses process `pid` listens on, as `ss` (in that host's namespace) shows them."""
    from cluster import on_host

    cmd = ["ss", "-Hltnp"] if host is None else on_host(host, ["ss", "-Hltnp"])
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    return [line.split()[3].rsplit(":", 1)[0] for line in out.splitlines() if f"pid={pid}," in line]


@pytest.mark.multinode
def test_one_host_ddp_job_listens_on_loopback_only(cluster, tmp_path):
    """On node0 the host name resolves to its network address, where gloo would listen by default."""
    from cluster import on_host

    run_dir = tmp_path / "run"
    job = Job(on_host("node0", [str(BIN / "torchrun"), "--standalone", "--nproc-per-node=2", "-m", "ddp_train",
                                "--model", "mlp", "--epochs", "400", "--threads", "1", "--run-dir", str(run_dir)]))
    try:
        job.wait_for(r"epoch 2 step")
        for rank in range(2):
            addresses = _listening_addresses(worker(str(run_dir), rank).pid, host="node0")
            assert addresses, f"rank {rank} listens nowhere?"
            assert all(a in LOOPBACK for a in addresses), addresses
    finally:
        job.proc.send_signal(signal.SIGTERM)
        job.wait(timeout=30)
    assert_nothing_left(str(run_dir))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("started,missing", [(0, 1), (1, 0)])
def test_a_rank_that_never_joins_the_rendezvous_is_named(tmp_path, started, missing):
    """Ranks started by hand (or srun) meet at MASTER_ADDR:MASTER_PORT; one of two never comes."""
    env = {"RANK": str(started), "WORLD_SIZE": "2", "LOCAL_RANK": str(started), "LOCAL_WORLD_SIZE": "2",
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port())}
    result = run_cmd([PY, "-m", "ddp_train", *TINY, "--timeout", "6", "--run-dir", str(tmp_path)], timeout=90, env=env)
    assert result.returncode == 2 and result.seconds < 40, result.output[-2000:]
    if started == 0:
        expected = "[rank 0] ddp_train: error: rank 1 did not join the rendezvous at 127.0.0.1:"
    else:  # rank 0 hosts the store: without it there is nothing to reach
        expected = "[rank 1] ddp_train: error: cannot reach the rendezvous at 127.0.0.1:"
    assert expected in result.output and "within --timeout 6 s" in result.output, result.output[-2000:]
    assert "Traceback" not in result.output


def test_threads_that_start_jobs_at_once_all_find_the_launchers():
    """The launcher registry loads on first use; threads that start jobs at the same moment (one per host,
    or a test's jobs) each find every launcher, in a process where none has looked yet."""
    script = ("from concurrent.futures import ThreadPoolExecutor\n"
              "from common import launch\n"
              "names = ['torchrun', 'horovodrun-gloo', 'horovodrun-mpi', 'mpirun'] * 8\n"
              "with ThreadPoolExecutor(len(names)) as pool:\n"
              "    print(sorted(set(pool.map(lambda name: launch.get(name).name, names))))\n")
    result = run_cmd([PY, "-c", script], timeout=60).check()
    assert result.output.strip() == "['horovodrun-gloo', 'horovodrun-mpi', 'mpirun', 'torchrun']"


def test_open_mpi_jobs_started_at_once_each_use_a_session_directory_of_their_own():
    """Open MPI 4 keeps a user's mpiruns on a host under one session directory, which one that ends removes as
    another may be creating it (open-mpi/ompi#8510): each job started at once has its own, Open MPI puts its session
    there, and it is gone once the job has ended."""
    from hvd_train.launch import mpi_flags

    show = ["mpirun", *mpi_flags(), "-np", "2", "sh", "-c", f'ls -d "${OPEN_MPI_SESSIONS}"/ompi.*/*']
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda _: run_cmd(show, timeout=60).check(), range(4)))
    bases = [{Path(line).parents[1] for line in result.output.split()} for result in results]
    assert all(len(base) == 1 for base in bases), [result.output for result in results]
    assert len(set().union(*bases)) == 4, bases
    assert not any(base.exists() for base in set().union(*bases))


def test_a_torchrun_job_logs_in_a_folder_of_its_own_removed_when_it_ends(tmp_path):
    """Told nothing, torchrun leaves a torchelastic_* folder in the temporary directory after every job: a job
    started here gives it the job's own folder, gone once the job has ended; a log folder the caller chose wins."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    show = [str(BIN / "torchrun"), "--standalone", "--nproc-per-node", "1", "--no-python",
            "sh", "-c", 'echo "error file: $TORCHELASTIC_ERROR_FILE"']
    result = run_cmd(show, env={"TMPDIR": str(tmp)}, timeout=120).check()
    (error_file,) = re.findall(r"error file: (\S+)", result.output)
    assert any(folder.name.startswith("job-") for folder in Path(error_file).parents), error_file
    assert not Path(error_file).parents[3].exists(), error_file  # the job's torchrun folder, and all in it
    assert not list(tmp.iterdir())
    chosen = tmp_path / "chosen"
    run_cmd(show, env={"TMPDIR": str(tmp), TORCHRUN_LOGS: str(chosen)}, timeout=120).check()
    assert list(chosen.iterdir()) and not list(tmp.iterdir())
