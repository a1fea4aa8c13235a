"""A one-node Slurm cluster on localhost for the launcher tests: munged, slurmctld -D and slurmd -D, all in one
temporary directory with a generated slurm.conf (no accounting, no cgroups), reached through SLURM_CONF.

`one_node_cluster(root, gpus)` yields a `Cluster`; `missing()` names the daemons that are not installed (the tests
skip with it). The node offers `gpus` stand-in GPUs (regular files in gres.conf: task/none never opens them), so
scripts that ask `--gpus-per-node` are scheduled as on a DGX. Slurm 22.05 (Debian 12's slurm-wlm).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from trtllm_dflash.engine.loader import free_port

DAEMONS = ("munged", "mungekey", "slurmctld", "slurmd", "sbatch", "squeue", "scancel", "scontrol")
SBIN = "/usr/sbin"


def which(name: str) -> str | None:
    return shutil.which(name) or shutil.which(name, path=SBIN)


def missing() -> list[str]:
    """The cluster's programs that are not installed (apt-get install slurm-wlm munge)."""
    return [name for name in DAEMONS if which(name) is None]


@dataclass
class Cluster:
    root: Path
    node: str
    env: dict[str, str]  # SLURM_CONF and the rest a client command needs

    def run(self, *argv: str, check: bool = True, **env) -> subprocess.CompletedProcess:
        return subprocess.run(list(argv), capture_output=True, text=True, check=check, env={**self.env, **env},
                              timeout=60)

    def sbatch(self, *argv: str, **env) -> str:
        """-> the job id (sbatch --parsable)."""
        return self.run("sbatch", "--parsable", *argv, **env).stdout.strip().split(";")[0]

    def state(self, job: str) -> str:
        """The job's state (PENDING, RUNNING, COMPLETED, CANCELLED, ...); '' once slurmctld forgot it."""
        out = self.run("scontrol", "-o", "show", "job", job, check=False).stdout
        fields = dict(f.split("=", 1) for f in out.split() if "=" in f)
        return fields.get("JobState", "")

    def wait_state(self, job: str, states: set[str], timeout: float) -> str:
        deadline = time.monotonic() + timeout
        while (state := self.state(job)) not in states:
            if time.monotonic() > deadline:
                raise AssertionError(f"job {job} is {state!r} after {timeout} s, not one of {sorted(states)}\n"
                                     + self.logs())
            time.sleep(0.5)
        return state

    def logs(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text()[-2000:]}" for p in sorted(self.root.glob("*.log")))


def slurm_conf(root: Path, node: str, cpus: int, gpus: int, ports: tuple[int, int]) -> str:
    gres = f" Gres=gpu:{gpus}" if gpus else ""
    return f"""ClusterName=dflashtest
SlurmctldHost=localhost
SlurmctldPort={ports[0]}
SlurmdPort={ports[1]}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={root}/munge.socket
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd.pid
SlurmctldLogFile={root}/slurmctld.log
SlurmdLogFile={root}/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
GresTypes=gpu
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MpiDefault=none
SchedulerType=sched/backfill
ReturnToService=2
SlurmdParameters=config_overrides
KillWait=20
MinJobAge=5
NodeName={node} NodeAddr=127.0.0.1 CPUs={cpus} RealMemory=1000{gres} State=UNKNOWN
PartitionName=debug Nodes={node} Default=YES MaxTime=INFINITE State=UP
"""


def start(argv: list[str], log: Path) -> subprocess.Popen:
    return subprocess.Popen(argv, stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True)


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def wait_for(condition, timeout: float, what: str, cluster: Cluster | None = None) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} after {timeout} s" + ("\n" + cluster.logs() if cluster else ""))
        time.sleep(0.3)


@contextmanager
def one_node_cluster(root: Path, gpus: int = 0):
    """munged, slurmctld and slurmd for this host, with `gpus` stand-in GPUs; all stopped on exit."""
    root.mkdir(parents=True, exist_ok=True)
    root.chmod(0o700)  # munged refuses a key or socket directory others may write
    node = socket.gethostname().split(".")[0]
    for sub in ("state", "spool", "dev"):
        (root / sub).mkdir(exist_ok=True)
    files = [root / "dev" / f"gpu{i}" for i in range(gpus)]
    for f in files:
        f.touch()
    (root / "gres.conf").write_text("".join(f"NodeName={node} Name=gpu File={f}\n" for f in files))
    (root / "slurm.conf").write_text(slurm_conf(root, node, os.cpu_count() or 1, gpus, (free_port(), free_port())))
    env = {**os.environ, "SLURM_CONF": str(root / "slurm.conf")}
    cluster = Cluster(root, node, env)
    key = root / "munge.key"
    subprocess.run([which("mungekey"), "--create", f"--keyfile={key}"], check=True, capture_output=True)
    procs = [start([which("munged"), "--foreground", "--force", f"--socket={root}/munge.socket",
                    f"--key-file={key}", f"--log-file={root}/munged.log", f"--pid-file={root}/munged.pid",
                    f"--seed-file={root}/munged.seed"], root / "munged.out")]
    try:
        wait_for((root / "munge.socket").exists, 20, "munged has no socket", cluster)
        procs.append(start([which("slurmctld"), "-D", "-i", "-f", str(root / "slurm.conf")], root / "slurmctld.out"))
        procs.append(start([which("slurmd"), "-D", "-f", str(root / "slurm.conf"), "-N", node],
                           root / "slurmd.out"))
        wait_for(lambda: idle(cluster), 60, "the node is not idle", cluster)
        yield cluster
    finally:
        if len(procs) == 3:
            cancel_all(cluster)
        for proc in reversed(procs):
            stop(proc)


def cancel_all(cluster: Cluster, timeout: float = 120) -> None:
    """Cancel every job and wait until none is left running or completing: a job outliving its slurmd would keep
    its slurmstepd, srun and processes."""
    cluster.run("scancel", f"--user={os.getuid()}", check=False)
    wait_for(lambda: not cluster.run("squeue", "-h", check=False).stdout.strip(), timeout, "jobs still running",
             cluster)


def idle(cluster: Cluster) -> bool:
    out = cluster.run("sinfo", "-h", "-N", "-o", "%T", check=False).stdout.split()
    return out == ["idle"]
