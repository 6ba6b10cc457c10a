"""A local Apache Flink session cluster: one JobManager and N TaskManagers on loopback, started with plain
``java`` from the jars of PyPI's ``apache-flink-libraries`` source distribution (its ``deps/``: flink-dist
and lib/, no release tarball, no Flink shell scripts), stopped by the process ids it recorded.

Why this shape: PyPI is the one way Flink's jars reach a machine that can only use package registries, and
the sdist's ``deps/`` is unpacked into the project's cache (``pipelines.artifacts``), never installed beside
Beam (the ``apache-flink`` package pins an old Beam). Flink 1.19.3: the Flink of Beam 2.62's runner
(``pipelines.flink_job_server``), the newest Beam/Flink pair whose job server Maven Central serves.
Everything a run writes lives under the cluster directory:
``conf/config.yaml`` (generated), ``log/`` (each process's log and stdout), ``checkpoints/``,
``savepoints/``, ``tmp/`` and ``pids.json``. The memory each process gets is computed by Flink's own
``BashJavaUtils``, as its scripts do, so the processes start exactly as ``jobmanager.sh``/``taskmanager.sh``
would start them.

``python -m pipelines.flink_cluster start DIR`` (or ``deploy/flink/local-cluster start DIR``) prints the REST
address ``HOST:PORT`` as its last line once every TaskManager has registered; ``stop DIR`` sends SIGTERM to
each recorded process (TaskManagers first) and SIGKILL to any still alive after a grace period.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
import zipfile
from pathlib import Path

from pipelines.artifacts import unpacked_sdist

FLINK_VERSION = "1.19.3"  # the runner of Beam 2.62 is built for Flink 1.19 (pipelines.flink_job_server)
HOST = "127.0.0.1"
JOBMANAGER_MAIN = "org.apache.flink.runtime.entrypoint.StandaloneSessionClusterEntrypoint"
TASKMANAGER_MAIN = "org.apache.flink.runtime.taskexecutor.TaskManagerRunner"
BASH_JAVA_UTILS = "org.apache.flink.runtime.util.bash.BashJavaUtils"
RESULT_PREFIX = "BASH_JAVA_UTILS_EXEC_RESULT:"
STOP_GRACE_S = 30.0
LOG4J = """\
rootLogger.level = INFO
rootLogger.appenderRef.file.ref = MainAppender
appender.main.name = MainAppender
appender.main.type = File
appender.main.append = true
appender.main.fileName = ${sys:log.file}
appender.main.layout.type = PatternLayout
appender.main.layout.pattern = %d{yyyy-MM-dd HH:mm:ss,SSS} %-5p %-60c %x - %m%n
"""


def flink_home(version: str = FLINK_VERSION) -> Path:
    """The sdist's unpacked ``deps`` directory (``lib/flink-dist-<version>.jar``, ``lib/``, ``bin/``)."""
    return unpacked_sdist(f"apache-flink-libraries=={version}", "deps", f"flink-{version}")


PORT_ATTEMPTS = 3  # start attempts when a port picked free was taken before the JobManager bound it


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


class LocalFlinkCluster:
    """One JobManager and ``taskmanagers`` TaskManagers of ``slots`` slots each, all state under ``directory``."""

    def __init__(self, directory: str | os.PathLike[str], rest_port: int = 0, slots: int = 2, taskmanagers: int = 2,
                 version: str = FLINK_VERSION, taskmanager_memory: str = "1024m",
                 jobmanager_memory: str = "1024m") -> None:
        self.directory = Path(directory).resolve()
        self.rest_port, self.slots, self.taskmanagers = rest_port, slots, taskmanagers
        self.version, self.tm_memory, self.jm_memory = version, taskmanager_memory, jobmanager_memory

    # -- layout -------------------------------------------------------------------------------------------
    @property
    def conf_dir(self) -> Path:
        return self.directory / "conf"

    @property
    def log_dir(self) -> Path:
        return self.directory / "log"

    @property
    def pids_path(self) -> Path:
        return self.directory / "pids.json"

    @property
    def rest(self) -> str:
        """``HOST:PORT`` of the REST API (and of ``--flink_master``), as written to the config."""
        port = re.search(r"^rest\.port: (\d+)$", (self.conf_dir / "config.yaml").read_text(), re.M)
        assert port, "the cluster was never configured"
        return f"{HOST}:{port.group(1)}"

    def pids(self) -> dict[str, int]:
        return json.loads(self.pids_path.read_text()) if self.pids_path.is_file() else {}

    # -- start ------------------------------------------------------------------------------------------
    def start(self, timeout_s: float = 120.0) -> str:
        """Start the cluster (refused if this directory's cluster still runs); return ``HOST:PORT`` once every
        TaskManager has registered with the JobManager."""
        alive = {name: pid for name, pid in self.pids().items() if self.owns(pid)}
        if alive:
            raise RuntimeError(f"a cluster from {self.directory} is still running ({alive}): stop it first")
        home = flink_home(self.version)
        for sub in ("conf", "log", "checkpoints", "savepoints", "tmp"):
            (self.directory / sub).mkdir(parents=True, exist_ok=True)
        for attempt in range(PORT_ATTEMPTS):
            self._write_config(home)
            self.pids_path.write_text("{}")
            try:
                self._launch("jobmanager", JOBMANAGER_MAIN, "GET_JM_RESOURCE_PARAMS", home)
                for index in range(1, self.taskmanagers + 1):
                    self.start_taskmanager(index, home)
                self.wait_ready(self.taskmanagers, timeout_s)
                return self.rest
            except BaseException as err:
                self.stop(grace_s=10.0)  # a cluster that did not come up leaves no process behind
                # A free port we picked can be taken by another process before the JVM binds it: pick again.
                if self.rest_port or "BindException" not in str(err) or attempt + 1 == PORT_ATTEMPTS:
                    raise
        raise AssertionError("unreachable")

    def start_taskmanager(self, index: int, home: Path | None = None) -> int:
        """Start TaskManager ``index`` (again, after a crash); returns its pid."""
        return self._launch(f"taskmanager-{index}", TASKMANAGER_MAIN, "GET_TM_RESOURCE_PARAMS",
                            home or flink_home(self.version))

    def _write_config(self, home: Path) -> None:
        port = self.rest_port or free_port()
        settings = {
            "jobmanager.rpc.address": HOST, "jobmanager.bind-host": HOST, "jobmanager.rpc.port": free_port(),
            "jobmanager.memory.process.size": self.jm_memory,
            "taskmanager.host": HOST, "taskmanager.bind-host": HOST,
            "taskmanager.numberOfTaskSlots": self.slots, "taskmanager.memory.process.size": self.tm_memory,
            "rest.address": HOST, "rest.bind-address": HOST, "rest.port": port,
            "blob.server.port": 0, "parallelism.default": min(2, self.slots * self.taskmanagers),
            "state.backend.type": "hashmap",
            "state.checkpoints.dir": (self.directory / "checkpoints").as_uri(),
            "state.savepoints.dir": (self.directory / "savepoints").as_uri(),
            # A TaskManager that dies is replaced by restarting its job's tasks from the last checkpoint.
            "restart-strategy.type": "fixed-delay", "restart-strategy.fixed-delay.attempts": 20,
            "restart-strategy.fixed-delay.delay": "2 s",
            "taskmanager.load-balance.mode": "SLOTS",  # spread a job's slots over the TaskManagers
            "heartbeat.timeout": 15000,  # a killed TaskManager is noticed within seconds, not 50 s
            "io.tmp.dirs": str(self.directory / "tmp"),
            "env.java.opts.all": _java_module_opts(home, self.version),
        }
        text = "".join(f"{key}: {value}\n" for key, value in settings.items())
        (self.conf_dir / "config.yaml").write_text(text)
        (self.conf_dir / "log4j.properties").write_text(LOG4J)

    def _classpath(self, home: Path) -> str:
        jars = sorted((home / "lib").glob("*.jar"), key=lambda p: "flink-dist" in p.name)  # flink-dist last
        return os.pathsep.join(str(j) for j in jars)

    def _resource_params(self, home: Path, command: str) -> tuple[list[str], list[str]]:
        """(JVM flags, dynamic ``-D key=value`` settings) for a process, from Flink's own memory model."""
        done = subprocess.run(["java", "-cp", str(home / "bin" / "bash-java-utils.jar") + os.pathsep
                               + self._classpath(home), BASH_JAVA_UTILS, command, "--configDir", str(self.conf_dir)],
                              capture_output=True, text=True, timeout=120)
        results = [ln[len(RESULT_PREFIX):] for ln in done.stdout.splitlines() if ln.startswith(RESULT_PREFIX)]
        if done.returncode != 0 or len(results) < 2:
            raise RuntimeError(f"Flink's BashJavaUtils {command} failed: {(done.stderr or done.stdout)[-500:]}")
        return results[-2].split(), results[-1].split()

    def _launch(self, name: str, main: str, params: str, home: Path) -> int:
        jvm, dynamic = self._resource_params(home, params)
        opts = (self.conf_dir / "config.yaml").read_text()
        module_opts = re.search(r"^env\.java\.opts\.all: (.*)$", opts, re.M)
        cmd = ["java", *jvm, *(module_opts.group(1).split() if module_opts else []),
               f"-Dlog.file={self.log_dir / (name + '.log')}",
               f"-Dlog4j.configurationFile={(self.conf_dir / 'log4j.properties').as_uri()}",
               "-cp", self._classpath(home), main, "--configDir", str(self.conf_dir), *dynamic]
        with open(self.log_dir / f"{name}.out", "ab") as out:
            proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    cwd=self.directory, start_new_session=True)  # outlives the starting command
        pids = self.pids()
        pids[name] = proc.pid
        tmp = self.pids_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(pids, indent=1))
        tmp.replace(self.pids_path)
        return proc.pid

    # -- REST -------------------------------------------------------------------------------------------
    def get(self, path: str, timeout_s: float = 5.0) -> dict:
        with urllib.request.urlopen(f"http://{self.rest}{path}", timeout=timeout_s) as response:
            return json.loads(response.read())

    def overview(self) -> dict:
        return self.get("/overview")

    def wait_ready(self, taskmanagers: int, timeout_s: float = 120.0) -> dict:
        """Wait until ``taskmanagers`` TaskManagers are registered (a dead JobManager fails at once)."""
        deadline = time.monotonic() + timeout_s
        last: object = None
        while time.monotonic() < deadline:
            if not self.owns(self.pids().get("jobmanager", -1)):
                raise RuntimeError(f"the JobManager exited: {self._root_cause('jobmanager')} (logs in {self.log_dir})")
            try:
                overview = self.overview()
                if overview.get("taskmanagers") == taskmanagers:
                    return overview
                last = overview
            except OSError as err:
                last = err
            time.sleep(0.5)
        raise TimeoutError(f"{taskmanagers} TaskManagers did not register within {timeout_s:.0f} s ({last}); "
                           f"see {self.log_dir}")

    def _root_cause(self, name: str) -> str:
        """The innermost ``Caused by:`` of a process's log (else its last ERROR line): one line for the operator."""
        try:
            text = (self.log_dir / f"{name}.log").read_text(errors="replace")
        except OSError:
            return "no log"
        causes = re.findall(r"^Caused by: (.*)$", text, re.M) or re.findall(r" ERROR .* - (.*)$", text, re.M)
        return causes[-1].strip()[:300] if causes else "no error in its log"

    # -- stop -------------------------------------------------------------------------------------------
    def owns(self, pid: int) -> bool:
        """Alive and started with this cluster's config dir (a recycled pid is someone else's)."""
        try:
            return str(self.conf_dir) in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
        except OSError:
            return False

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        """Signal one of the cluster's processes (a failure test's SIGKILL of a TaskManager)."""
        pid = self.pids()[name]
        if self.owns(pid):
            os.kill(pid, sig)

    def stop(self, grace_s: float = STOP_GRACE_S) -> dict[str, str]:
        """SIGTERM every recorded process (TaskManagers first), SIGKILL what outlives ``grace_s``."""
        pids = self.pids()
        order = sorted(pids, key=lambda name: name == "jobmanager")
        outcome: dict[str, str] = {}
        for name in order:
            if self.owns(pids[name]):
                os.kill(pids[name], signal.SIGTERM)
                outcome[name] = "terminated"
            else:
                outcome[name] = "not running"
        deadline = time.monotonic() + grace_s
        for name in order:
            while self.owns(pids[name]) and time.monotonic() < deadline:
                time.sleep(0.2)
            if self.owns(pids[name]):
                os.kill(pids[name], signal.SIGKILL)
                outcome[name] = "killed"
        self.pids_path.write_text("{}")
        return outcome


def _java_module_opts(home: Path, version: str) -> str:
    """The ``--add-opens``/``--add-exports`` flags Flink's default config gives its JVMs on Java 17+."""
    with zipfile.ZipFile(home / "lib" / f"flink-dist-{version}.jar") as dist:
        default = dist.read("config.yaml").decode()
    found = re.search(r"^\s+all: (--add-.*)$", default, re.M)
    return found.group(1).strip() if found else ""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="local-cluster", description=__doc__.split("\n\n")[0])
    parser.add_argument("action", choices=["start", "stop", "status"])
    parser.add_argument("directory", help="the cluster's directory: config, logs, checkpoints, savepoints, pids")
    parser.add_argument("--rest-port", type=int, default=8081, help="REST port (0: a free one); default 8081")
    parser.add_argument("--slots", type=int, default=2, help="task slots per TaskManager")
    parser.add_argument("--taskmanagers", type=int, default=2)
    parser.add_argument("--flink-version", default=FLINK_VERSION)
    parser.add_argument("--taskmanager-memory", default="1024m", help="each TaskManager's process size")
    args = parser.parse_args(argv)
    cluster = LocalFlinkCluster(args.directory, args.rest_port, args.slots, args.taskmanagers, args.flink_version,
                                args.taskmanager_memory)
    try:
        if args.action == "start":
            print(cluster.start(), flush=True)
        elif args.action == "stop":
            for name, what in cluster.stop().items():
                print(f"{name}: {what}")
        else:
            print(json.dumps({"pids": cluster.pids(), "overview": cluster.overview()}))
    except (RuntimeError, TimeoutError, OSError) as err:
        print(f"local-cluster {args.action}: {err}".splitlines()[0], file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
