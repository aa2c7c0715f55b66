"""deploy/slurm/ on a real Slurm, as users run it: Debian's munged, slurmctld and slurmd started here (one node,
this machine, on loopback ports; proctrack/linuxproc and task/none, as no cgroup controller is ours to use),
the Prolog, Epilog and TaskProlog installed as slurm.conf names them, and jobs submitted with sbatch as an
unprivileged user that ask for a dataset on a loopback web server in their comment, read it with
cloud-volume and end; a job that asks for a directory of datasets; two jobs on the node at once; an epilog whose
mount's daemon hangs; a dataset that cannot be mounted. After each job nothing stays mounted and the node stays
in service."""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import psutil
import pytest

from shardfs.service import mountinfo
from tests.support.cloud import free_port
from tests.support.http_server import RangeServer
from tests.support.users import as_user

pytestmark = [pytest.mark.kernel, pytest.mark.root, pytest.mark.loopback, pytest.mark.slurm]


ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = ROOT / "deploy" / "slurm"
PATIENCE = 180.0  # seconds: only a hang waits this long
# The job's user cannot reach this interpreter (a pyenv under /root): jobs run Debian's Python 3.11 on the same
# packages.
SYSTEM_PYTHON = "/usr/bin/python3.11"
PYTHONPATH = f"{ROOT}:{ROOT}/.venv/lib/python3.11/site-packages"


@dataclass
class Slurm:
    root: Path
    jobs: Path
    env: dict[str, str]
    user: tuple[int, int]

    def run(self, *command: str, as_user: bool = False) -> str:
        drop = ["setpriv", f"--reuid={self.user[0]}", f"--regid={self.user[1]}", "--init-groups"] if as_user else []
        done = subprocess.run(
            [*drop, *command], env=self.env, capture_output=True, text=True, timeout=PATIENCE, cwd=self.root / "out"
        )
        assert done.returncode == 0, f"{command}: {done.stderr}"
        return done.stdout

    def submit(self, script: str, comment: str) -> int:
        path = self.root / "out" / f"job-{time.monotonic_ns()}.sh"
        path.write_text("#!/bin/bash\n" + textwrap.dedent(script))
        path.chmod(0o755)
        out = self.run("sbatch", "--parsable", "-n1", "-c1", f"--comment={comment}", "-o", "%j.out", str(path),
                       as_user=True)  # fmt: skip
        return int(out.strip().split(";")[0])

    def state(self, job: int) -> str:
        text = self.run("scontrol", "-o", "show", "job", str(job))
        return next(w.split("=", 1)[1] for w in text.split() if w.startswith("JobState="))

    def ended(self, job: int) -> str:
        """The job's end state, once its epilog has run (COMPLETING until then)."""
        deadline = time.monotonic() + PATIENCE
        while (state := self.state(job)) in ("PENDING", "CONFIGURING", "RUNNING", "COMPLETING"):
            assert time.monotonic() < deadline, f"job {job} still {state}"
            time.sleep(0.2)
        return state

    def node_state(self) -> str:
        return self.run("sinfo", "-h", "-N", "-o", "%T").strip()

    def output(self, job: int) -> str:
        return (self.root / "out" / f"{job}.out").read_text()


def _wait(condition, what: str, patience: float = PATIENCE) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + patience
    while not condition():
        assert time.monotonic() < deadline, f"waited {patience:.0f} s for {what}"
        time.sleep(0.2)


@pytest.fixture(scope="module")
def slurm(user: tuple[int, int]) -> Iterator[Slurm]:
    for tool in ("munged", "slurmctld", "slurmd", "sbatch"):
        assert shutil.which(tool), f"{tool} missing: scripts/setup installs Debian's munge, slurmctld and slurmd"
    root = Path(tempfile.mkdtemp(prefix="shardfs-slurm-", dir="/tmp"))
    root.chmod(0o755)
    for d in ("munge", "state", "spool", "log", "out", "etc"):
        (root / d).mkdir()
    (root / "out").chmod(0o1777)  # the job's user writes its output here
    shutil.chown(root / "munge", "munge", "munge")
    jobs = root / "jobs"
    conf = root / "etc" / "shardfs-slurm.conf"
    # The Prolog and Epilog run shardfs.slurm as root with the test's own Python, as a node would with its own.
    conf.write_text(f"SHARDFS_PYTHON={sys.executable}\nSHARDFS_JOBS={jobs}\nSHARDFS_MOUNT_TIMEOUT=120\n")
    # Chained with a site's own scripts, as the README says: Prolog= and Epilog= a glob of a directory holding both,
    # TaskProlog= a script of the site's that runs shardfs's last.
    site = {
        "prolog.d/site": 'touch "$SLURM_JOB_ID.site-prolog"',
        "epilog.d/site": 'touch "$SLURM_JOB_ID.site-epilog"',
        "prolog.d/shardfs-prolog": f"SHARDFS_SLURM_CONF={conf} exec {SCRIPTS / 'shardfs-prolog'}",
        "epilog.d/shardfs-epilog": f"SHARDFS_SLURM_CONF={conf} exec {SCRIPTS / 'shardfs-epilog'}",
        "task-prolog": "echo export SITE_TASK_PROLOG=ran\n"
        f"SHARDFS_SLURM_CONF={conf} exec {SCRIPTS / 'shardfs-task-prolog'}",
    }
    for name, text in site.items():  # the site's own write into out/, as the job's user can read
        script = root / "etc" / name
        script.parent.mkdir(exist_ok=True)
        script.write_text(f"#!/bin/sh\ncd {root / 'out'}\n{text}\n")
        script.chmod(0o755)
    host = socket.gethostname().split(".")[0]  # slurmd finds its node by the short host name
    munge_socket = root / "munge" / "munge.sock"
    slurm_conf = root / "etc" / "slurm.conf"
    slurm_conf.write_text(
        textwrap.dedent(f"""\
        ClusterName=shardfstest
        SlurmctldHost={host}(127.0.0.1)
        SlurmctldPort={free_port()}
        SlurmdPort={free_port()}
        SlurmUser=root
        AuthType=auth/munge
        AuthInfo=socket={munge_socket}
        StateSaveLocation={root}/state
        SlurmdSpoolDir={root}/spool
        SlurmctldPidFile={root}/slurmctld.pid
        SlurmdPidFile={root}/slurmd.pid
        SlurmctldLogFile={root}/log/slurmctld.log
        SlurmdLogFile={root}/log/slurmd.log
        SlurmdDebug=debug
        ProctrackType=proctrack/linuxproc
        TaskPlugin=task/none
        JobAcctGatherType=jobacct_gather/none
        AccountingStorageType=accounting_storage/none
        SelectType=select/cons_tres
        SelectTypeParameters=CR_CPU
        MpiDefault=none
        ReturnToService=2
        Prolog={root}/etc/prolog.d/*
        Epilog={root}/etc/epilog.d/*
        TaskProlog={root}/etc/task-prolog
        PrologFlags=Alloc
        NodeName={host} NodeAddr=127.0.0.1 CPUs=2 RealMemory=1000 State=UNKNOWN
        PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
        """)
    )
    env = {"PATH": "/usr/bin:/bin:/usr/sbin:/sbin", "SLURM_CONF": str(slurm_conf), "PYTHONPATH": PYTHONPATH}
    munge = root / "munge"
    key = munge / "munge.key"  # the test's own: nothing of the machine's munge is used or changed
    key.write_bytes(os.urandom(1024))
    key.chmod(0o400)
    shutil.chown(key, "munge", "munge")
    subprocess.run(
        ["setpriv", "--reuid=munge", "--regid=munge", "--clear-groups", "munged", f"--socket={munge_socket}",
         f"--key-file={key}", f"--pid-file={munge}/munged.pid", f"--log-file={munge}/munged.log",
         f"--seed-file={munge}/seed"],
        check=True, timeout=PATIENCE,
    )  # fmt: skip
    daemons = [
        subprocess.Popen([tool, "-D", "-f", str(slurm_conf)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for tool in ("slurmctld", "slurmd")
    ]
    cluster = Slurm(root, jobs, env, user)
    try:
        _wait(lambda: _idle(cluster), "the node to be idle")
        yield cluster
    finally:
        _stop(cluster, daemons, root)


def _stop(cluster: Slurm, daemons: list[subprocess.Popen[bytes]], root: Path) -> None:
    """Jobs cancelled and their epilogs run, then Slurm and munged stopped (killed if they do not stop), and
    whatever a failed test left mounted taken down and named."""
    subprocess.run(["scancel", "--partition=debug"], env=cluster.env, capture_output=True, timeout=PATIENCE)
    with contextlib.suppress(AssertionError):
        _wait(lambda: not cluster.run("squeue", "-h").strip(), "the jobs to end", patience=60)
    for daemon in daemons:
        daemon.send_signal(signal.SIGTERM)
        try:
            daemon.wait(30)
        except subprocess.TimeoutExpired:  # slurmd waits on threads retrying a controller that is gone
            daemon.kill()
            daemon.wait()
    with contextlib.suppress(OSError, ValueError):
        os.kill(int((root / "munge" / "munged.pid").read_text()), signal.SIGTERM)
    left = [p for p, _ in mountinfo.shardfs_mounts() if p.startswith(str(cluster.jobs))]
    for point in left:
        subprocess.run(["umount", "-l", point], check=False)
    shutil.rmtree(root, ignore_errors=True)
    assert not left, f"left mounted: {left}"


def _idle(cluster: Slurm) -> bool:
    try:
        return cluster.node_state() == "idle"
    except AssertionError:
        return False


@pytest.fixture(scope="module")
def dataset(raw_volume) -> Iterator[tuple[str, Path, np.ndarray]]:
    """(source URL, unsharded twin, voxels): the sharded volume on a loopback web server."""
    source, twin, expected = raw_volume
    public = Path(tempfile.mkdtemp(prefix="shardfs-slurm-data-", dir="/tmp"))
    shutil.copytree(source, public / "vol")
    with RangeServer(public / "vol").running() as server:
        yield f"precomputed://{server.url}", twin, expected
    shutil.rmtree(public)


READ_WITH_CLOUDVOLUME = f"""\
    id -u > "$SLURM_JOB_ID.uid"
    echo "$SITE_TASK_PROLOG" > "$SLURM_JOB_ID.site-task-prolog"
    echo "$SHARDFS_DIR" > "$SLURM_JOB_ID.dir"
    {SYSTEM_PYTHON} - <<'EOF'
    import os, numpy as np
    from cloudvolume import CloudVolume
    cv = CloudVolume(f"file://{{os.environ['SHARDFS_DIR']}}/vol", mip=0, fill_missing=True, progress=False)
    np.save(f"{{os.environ['SLURM_JOB_ID']}}.npy", np.asarray(cv[cv.bounds]))
    EOF
"""


def _mounted_under(path: Path) -> list[str]:
    return [p for p, _ in mountinfo.shardfs_mounts() if p.startswith(f"{path}/")]


def test_a_job_reads_its_dataset_and_the_epilog_leaves_nothing(slurm: Slurm, dataset) -> None:
    url, _, expected = dataset
    job = slurm.submit(READ_WITH_CLOUDVOLUME, f"shardfs:vol={url}")
    assert slurm.ended(job) == "COMPLETED", slurm.output(job)
    out = slurm.root / "out"
    assert np.array_equal(np.load(out / f"{job}.npy"), expected)
    assert int((out / f"{job}.uid").read_text()) == slurm.user[0]
    assert (out / f"{job}.dir").read_text().strip() == str(slurm.jobs / str(job))
    assert not _mounted_under(slurm.jobs) and not (slurm.jobs / str(job)).exists()
    assert slurm.node_state() == "idle"
    # The site's own Prolog, Epilog and TaskProlog ran too, chained as the README says.
    assert (out / f"{job}.site-prolog").exists() and (out / f"{job}.site-epilog").exists()
    assert (out / f"{job}.site-task-prolog").read_text() == "ran\n"


def test_a_job_asking_for_a_directory_of_datasets_reads_a_chunk_below_it(slurm: Slurm, raw_volume) -> None:
    """A job's source may be a directory that is no dataset (issue 43): mounted through the Prolog and the host as
    a dataset is, it shows its plain directory as stored and the volume two directories down unsharded, every
    chunk equal to the unsharded twin's (`cmp`, as the job's user); the Epilog leaves nothing mounted."""
    source, twin, _ = raw_volume
    public = Path(tempfile.mkdtemp(prefix="shardfs-slurm-lab-", dir="/tmp"))
    try:
        shutil.copytree(source, public / "lab" / "em" / "vol")
        shutil.copytree(twin, public / "twin")
        (public / "lab" / "notes").mkdir()
        (public / "lab" / "notes" / "plan.txt").write_text("what is where\n")
        subprocess.run(["chmod", "-R", "a+rX", public], check=True)  # the job's user reads it, as its daemon does
        script = f"""\
            ls "$SHARDFS_DIR/lab" "$SHARDFS_DIR/lab/notes"
            cd {public / "twin"}
            n=0
            for chunk in $(find . -type f ! -name info); do
                cmp "$chunk" "$SHARDFS_DIR/lab/em/vol/$chunk" || exit 1
                n=$((n + 1))
            done
            echo "$n chunks equal"
        """
        job = slurm.submit(script, f"shardfs:lab={public / 'lab'}")
        assert slurm.ended(job) == "COMPLETED", slurm.output(job)
        output = slurm.output(job).split()
        chunks = sum(1 for p in twin.rglob("*") if p.is_file() and p.name != "info")
        assert output[:-3] == [f"{slurm.jobs / str(job)}/lab:", "em", "notes", f"{slurm.jobs / str(job)}/lab/notes:",
                               "plan.txt"], output  # fmt: skip
        assert output[-3:] == [str(chunks), "chunks", "equal"] and chunks > 1, output
        assert not _mounted_under(slurm.jobs) and not (slurm.jobs / str(job)).exists()
        assert slurm.node_state() == "idle"
    finally:
        shutil.rmtree(public)


def test_salloc_s_shell_has_no_shardfs_dir_but_its_steps_do(slurm: Slurm, dataset) -> None:
    """The datasets are mounted once salloc has its allocation (PrologFlags=Alloc), but its shell is no task: the
    TaskProlog, which exports $SHARDFS_DIR, runs for srun's steps (README, "Slurm")."""
    url, _, _ = dataset
    in_step = 'echo "step $SLURM_JOB_ID $SHARDFS_DIR"; ls "$SHARDFS_DIR/vol"'
    script = f"echo \"shell ${{SHARDFS_DIR:-none}}\"; srun -n1 sh -c '{in_step}'"
    said = slurm.run("salloc", "-n1", "-c1", f"--comment=shardfs:vol={url}", "sh", "-c", script, as_user=True)
    step = next(line.split() for line in said.splitlines() if line.startswith("step "))
    assert "shell none" in said and step[2] == str(slurm.jobs / step[1]) and "info" in said.splitlines(), said
    assert slurm.ended(int(step[1])) == "COMPLETED"
    assert not _mounted_under(slurm.jobs) and slurm.node_state() == "idle"


def _daemon_of(point: Path) -> psutil.Process:
    """The daemon serving point, as the Prolog recorded it for the Epilog."""
    return psutil.Process(int((point.parent / f".{point.name}.pid").read_text()))


HOLD = """\
    {SYSTEM_PYTHON} -c "import os; print(len(os.listdir(os.environ['SHARDFS_DIR'] + '/vol/4_4_40')))" \
        > "$SLURM_JOB_ID.count"
    while [ ! -e "$SLURM_JOB_ID.release" ]; do sleep 0.2; done
    sha256sum "$SHARDFS_DIR/vol/4_4_40/{name}" > "$SLURM_JOB_ID.sum"
"""


def test_two_jobs_on_the_node_at_once_each_keep_their_own_mount(slurm: Slurm, dataset) -> None:
    url, twin, _ = dataset
    name = sorted(os.listdir(twin / "4_4_40"))[0]
    held = slurm.submit(HOLD.format(SYSTEM_PYTHON=SYSTEM_PYTHON, name=name), f"shardfs:vol={url}")
    quick = slurm.submit(READ_WITH_CLOUDVOLUME, f"shardfs:vol={url},cache_size=8M")
    out = slurm.root / "out"
    _wait(lambda: (out / f"{held}.count").exists(), "the held job to read its mount")
    assert slurm.ended(quick) == "COMPLETED"
    assert _mounted_under(slurm.jobs) == [str(slurm.jobs / str(held) / "vol")]  # the other job's epilog left it
    other = as_user((65534, 65534), "ls", slurm.jobs / str(held) / "vol")  # another user of the node
    assert other.returncode != 0 and "Permission denied" in other.stderr
    (out / f"{held}.release").touch()
    assert slurm.ended(held) == "COMPLETED", slurm.output(held)
    assert int((out / f"{held}.count").read_text()) == len(os.listdir(twin / "4_4_40"))
    assert (out / f"{held}.sum").read_text().split()[0] == hashlib.sha256(
        (twin / "4_4_40" / name).read_bytes()
    ).hexdigest()
    assert not _mounted_under(slurm.jobs) and slurm.node_state() == "idle"


def test_a_jobs_daemon_killed_is_replaced_and_the_job_reads_on(slurm: Slurm, dataset) -> None:
    """The daemon of a running job's dataset killed (SIGKILL) is replaced as a CSI volume's is: a new daemon, the
    job's user too, takes the connection up, the job's next read gets every byte as written and no error, and the
    Epilog still leaves nothing (the new daemon ended, the node idle)."""
    url, twin, _ = dataset
    name = sorted(os.listdir(twin / "4_4_40"))[1]
    job = slurm.submit(HOLD.format(SYSTEM_PYTHON=SYSTEM_PYTHON, name=name), f"shardfs:vol={url}")
    out, point = slurm.root / "out", slurm.jobs / str(job) / "vol"
    _wait(lambda: (out / f"{job}.count").exists(), "the job to read its mount")
    killed = _daemon_of(point)
    killed.kill()
    _wait(lambda: _served_by(point) not in (None, killed.pid), "a new daemon to take the mount up")
    after = _daemon_of(point)
    assert after.uids().real == slurm.user[0]
    (out / f"{job}.release").touch()
    assert slurm.ended(job) == "COMPLETED", slurm.output(job)
    assert (out / f"{job}.sum").read_text().split()[0] == hashlib.sha256(
        (twin / "4_4_40" / name).read_bytes()
    ).hexdigest()
    assert not _mounted_under(slurm.jobs) and not (slurm.jobs / str(job)).exists()
    _wait(lambda: not after.is_running() or after.status() == psutil.STATUS_ZOMBIE, "the new daemon to end")
    assert slurm.node_state() == "idle"


def _served_by(point: Path) -> int | None:
    """The pid the Prolog's host records for point's daemon now (None while the file is being rewritten)."""
    with contextlib.suppress(OSError, ValueError):
        return int((point.parent / f".{point.name}.pid").read_text())
    return None


def test_the_epilog_takes_down_a_hung_daemons_mount_and_the_node_stays_in_service(slurm: Slurm, dataset) -> None:
    """The daemon stopped (SIGSTOP) while the job runs: the job's last read waits on it, the job is cancelled,
    the epilog aborts the connection and ends the daemon, and the node is idle again, not drained."""
    url, twin, _ = dataset
    job = slurm.submit("sleep 1000\n", f"shardfs:vol={url}")
    point = slurm.jobs / str(job) / "vol"
    pid_file = point.parent / f".{point.name}.pid"
    _wait(lambda: slurm.state(job) == "RUNNING" and pid_file.exists(), "the job to run with its mount")
    daemon = _daemon_of(point)
    assert daemon.uids().real == slurm.user[0]
    daemon.suspend()
    name = sorted(os.listdir(twin / "4_4_40"))[-1]
    reader = subprocess.Popen(
        ["cat", str(point / "4_4_40" / name)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    slurm.run("scancel", str(job))
    assert slurm.ended(job) == "CANCELLED"
    assert reader.wait(PATIENCE) != 0
    assert not _mounted_under(slurm.jobs) and not (slurm.jobs / str(job)).exists()
    _wait(lambda: not daemon.is_running() or daemon.status() == psutil.STATUS_ZOMBIE, "the daemon to end")
    assert slurm.node_state() == "idle"


def test_a_dataset_that_cannot_be_mounted_is_told_to_the_job_not_the_node(slurm: Slurm, dataset) -> None:
    url, _, _ = dataset
    job = slurm.submit('ls "$SHARDFS_DIR"\n', f"shardfs:gone={url}/no/such/dataset shardfs:../x={url}")
    assert slurm.ended(job) == "COMPLETED"
    output = slurm.output(job)
    assert "shardfs: gone not mounted:" in output and "no/such/dataset" in output
    assert not _mounted_under(slurm.jobs) and not (slurm.jobs / str(job)).exists()
    assert slurm.node_state() == "idle"


def test_a_job_cannot_set_who_may_reach_its_mount_nor_take_more_than_the_ceilings(slurm: Slurm, dataset) -> None:
    """allow_other or allow_root from a job's comment would have other users' df, and root's, wait on a daemon
    the job's user may stop (and other users read through it): every option of that kind is refused. Nor may a
    job's daemon, which runs outside the job's cgroup, take more memory or threads than the Prolog's ceilings."""
    url, _, _ = dataset
    asked = ["allow_other", "allow_root", "uid=0", "gid=0", "umask=0", "context=system_u:object_r:tmp_t:s0"]
    too_much = ["cache_size=100G", "max_file_size=2G", "max_threads=2000"]
    comment = " ".join(f"shardfs:v{i}={url},{option}" for i, option in enumerate(asked + too_much))
    job = slurm.submit('ls "$SHARDFS_DIR"\n', comment)
    assert slurm.ended(job) == "COMPLETED"
    output = slurm.output(job)
    for i, option in enumerate(asked):
        assert f"shardfs: v{i} not mounted: {option.split('=')[0]}: a job cannot set who" in output, output
    for i, _ in enumerate(too_much, len(asked)):
        said = [line for line in output.splitlines() if f"shardfs: v{i} not mounted: " in line]
        assert len(said) == 1 and "is over this node's ceiling" in said[0], output
    assert not _mounted_under(slurm.jobs) and not (slurm.jobs / str(job)).exists()
    assert slurm.node_state() == "idle"


def test_a_jobs_daemon_logs_where_the_job_can_read_it_and_names_never_collide(slurm: Slurm, dataset) -> None:
    """The daemon's log is <name>.log in the job's directory, the job's user's to read, and goes with the job (it
    logged into a deleted file on /run before, seen by no one, unbounded). Dataset names that would be the
    Prolog's own files (.run, NAME.error, .NAME.pid, NAME.log) are refused, and the dataset they would have
    clobbered still reads right."""
    url, _, expected = dataset
    clashing = ["vol.error", ".vol.pid", ".run", "vol.log"]
    comment = " ".join([f"shardfs:vol={url},log_level=INFO", *(f"shardfs:{name}={url}" for name in clashing)])
    script = READ_WITH_CLOUDVOLUME + '    cat "$SHARDFS_DIR/vol.log" > "$SLURM_JOB_ID.log"\n'
    job = slurm.submit(script, comment)
    assert slurm.ended(job) == "COMPLETED", slurm.output(job)
    out = slurm.root / "out"
    assert np.array_equal(np.load(out / f"{job}.npy"), expected)
    assert "not mounted" not in slurm.output(job)
    logged = (out / f"{job}.log").read_text()  # read by the job, as its user
    assert "event=mounted" in logged and url.removeprefix("precomputed://") in logged, logged
    assert not _mounted_under(slurm.jobs) and not (slurm.jobs / str(job)).exists()
    assert slurm.node_state() == "idle"


@dataclass
class Node:
    """deploy/slurm's scripts run as slurmd runs them (root's Prolog and Epilog, the user's TaskProlog, SLURM_* in
    the environment), without Slurm: for what only the scripts decide, in seconds rather than a cluster's minutes."""

    jobs: Path
    conf: Path
    user: tuple[int, int]

    def timeout(self, seconds: int) -> None:
        """The node's SHARDFS_MOUNT_TIMEOUT."""
        self.conf.write_text(
            f"SHARDFS_PYTHON={sys.executable}\nSHARDFS_JOBS={self.jobs}\nSHARDFS_MOUNT_TIMEOUT={seconds}\n"
        )

    def run(self, script: str, job: int, comment: str = "") -> str:
        env = {"PATH": "/usr/bin:/bin", "SHARDFS_SLURM_CONF": str(self.conf), "PYTHONPATH": str(ROOT),
               "SLURM_JOB_ID": str(job), "SLURM_JOB_UID": str(self.user[0]), "SLURM_JOB_GID": str(self.user[1]),
               "SLURM_JOB_COMMENT": comment}  # fmt: skip
        drop = ["setpriv", f"--reuid={self.user[0]}", f"--regid={self.user[1]}", "--clear-groups"]
        command = [*(drop if script == "shardfs-task-prolog" else []), str(SCRIPTS / script)]
        done = subprocess.run(command, env=env, cwd=ROOT, capture_output=True, text=True, timeout=PATIENCE)
        assert done.returncode == 0, done.stderr  # a failing Prolog or Epilog would drain the node
        return done.stdout

    def job(self, job: int, comment: str) -> list[str]:
        """What the job's tasks are told (the TaskProlog's lines), once its Prolog has run; then its Epilog."""
        self.run("shardfs-prolog", job, comment)
        try:
            return self.run("shardfs-task-prolog", job).splitlines()
        finally:
            self.run("shardfs-epilog", job)
            assert not _mounted_under(self.jobs) and not (self.jobs / str(job)).exists()


@pytest.fixture
def node(user: tuple[int, int], public_tmp: Path) -> Node:
    """As /etc/shardfs/slurm.conf sets it up, in a directory the job's user can reach."""
    conf = public_tmp / "slurm.conf"
    node = Node(public_tmp / "jobs", conf, user)
    node.timeout(60)  # a refusal's own words come before it, however loaded the machine
    return node


def test_a_job_is_told_why_in_its_own_words_once(node: Node, dataset) -> None:
    """Each refusal was told as `shardfs: NAME not mounted: shardfs: ...`, in the CSI plugin's words (volume
    attribute cacheSize, mountOptions, volume NAME:) and with `shardfs mount`'s flags (--endpoint)."""
    url, _, _ = dataset
    down = f"http://127.0.0.1:{free_port()}/vol"  # nothing listens there
    told = node.job(1, f"shardfs:big={url},cache_size=100G shardfs:mine={url},allow_other shardfs:typo=s3:/b/x "
                       f"shardfs:gone={url}/no/such/dataset shardfs:down={down},timeout=2")  # fmt: skip
    said = {line.split()[2]: line for line in told if line.startswith("print ")}
    assert said["big"].startswith("print shardfs: big not mounted: cache_size: 100.0 GiB is over this node's ceiling")
    assert said["mine"].startswith("print shardfs: mine not mounted: allow_other: a job cannot set who may reach")
    assert said["typo"].startswith("print shardfs: typo not mounted: source: s3:/b/x: looks like a URL without")
    assert said["gone"].startswith(f"print shardfs: gone not mounted: {url.removeprefix('precomputed://')}/no/such")
    assert said["down"].startswith(f"print shardfs: down not mounted: {down}: cannot be reached")
    assert "check the URL and endpoint" in said["down"]
    for line in said.values():
        assert line.count("shardfs:") == 1 and "volume" not in line and "--" not in line, line
    assert told[0] == f"export SHARDFS_DIR={node.jobs / '1'}" and len(told) == 6, told


def test_a_mount_cut_by_the_prolog_s_timeout_is_told_and_leaves_nothing(node: Node) -> None:
    """SHARDFS_MOUNT_TIMEOUT cut the mount with nothing said (`slow not mounted: `), and the Epilog left the job's
    directory behind, holding the cut process's socket."""
    node.timeout(3)
    with socket.socket() as silent:  # accepts, and never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        told = node.job(2, f"shardfs:slow=http://127.0.0.1:{silent.getsockname()[1]}/vol")
    assert told[1] == "print shardfs: slow not mounted: it took over 3 s (this node's SHARDFS_MOUNT_TIMEOUT): the" \
        " source was too slow to answer ", told  # fmt: skip


def test_job_7s_epilog_leaves_the_mount_of_job_70_on_the_same_node(node: Node, dataset) -> None:
    """Jobs 7 and 70 on one node at once, job 7's directory a prefix of job 70's name: job 7's Epilog takes down
    its own mount and no other; job 70 still reads its dataset, until its own Epilog."""
    url, twin, _ = dataset
    name = sorted(os.listdir(twin / "4_4_40"))[1]
    for job in (7, 70):
        node.run("shardfs-prolog", job, f"shardfs:vol={url}")
    try:
        assert _mounted_under(node.jobs) == [str(node.jobs / "7" / "vol"), str(node.jobs / "70" / "vol")]
        node.run("shardfs-epilog", 7)
        assert _mounted_under(node.jobs) == [str(node.jobs / "70" / "vol")] and not (node.jobs / "7").exists()
        read = as_user(node.user, "sha256sum", node.jobs / "70" / "vol" / "4_4_40" / name)
        assert read.stdout.split()[:1] == [hashlib.sha256((twin / "4_4_40" / name).read_bytes()).hexdigest()], read
    finally:
        node.run("shardfs-epilog", 70)
    assert not _mounted_under(node.jobs) and not (node.jobs / "70").exists()
