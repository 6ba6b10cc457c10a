"""Load on the ingestion edge (``esa edge``) over loopback, beside raw Kafka produce in the same run.

For each HTTP library -- uvicorn with httptools serving the ``Edge`` as a plain ASGI app (the kept one), and
aiohttp serving the same ``Edge`` (the alternative measured, ``benchmarks/edge_aiohttp.py``) -- start the edge
on a local Apache Kafka, drive ``POST /v1/reports`` with ``hey`` (rakyll/hey, ``go install
github.com/rakyll/hey@v0.1.4``) at ``--concurrency`` connections, and read the edge process's CPU seconds from
/proc: reports/s per core = requests / edge CPU seconds. Then the edge's resident memory idle and with
``--idle_connections`` open connections, and the raw produce rate of the same records with the edge's producer
settings (acks=all, idempotent), so the HTTP layer's cost is seen beside Kafka's. Every report gets a real 202
(Kafka acknowledged); the body is one real sealed set (the rate limit is off, ``--rate_per_device 0``).

    python benchmarks/edge_load.py --requests 20000 --concurrency 50 --repeats 3
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pipelines.broker import LocalBroker  # noqa: E402
from transforms.io.kafka.bounded import ensure_topics  # noqa: E402

HEY = shutil.which("hey") or str(Path.home() / "go" / "bin" / "hey")
_AIOHTTP_LAUNCH = """
import sys
sys.path.insert(0, {root!r}); sys.path.insert(0, {bench!r})
import edge_aiohttp
import pipelines.edge.server
pipelines.edge.server.serve = edge_aiohttp.serve
from pipelines.cli import main
sys.exit(main(sys.argv[1:]))
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _thread_cpu(pid: int) -> dict[str, float]:
    """CPU seconds per thread kind of the process: the event loop (its main thread), librdkafka's threads, the rest."""
    out: dict[str, float] = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
            name = (task / "comm").read_text().strip()
        except OSError:
            continue
        kind = "event loop" if task.name == str(pid) else ("librdkafka" if name.startswith("rdk:") else "other")
        out[kind] = out.get(kind, 0.0) + (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return out


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def start_edge(server: str, bootstrap: str, keys: Path, topic: str, spool: Path) -> tuple[subprocess.Popen, str]:
    port = _free_port()
    args = ["edge", "--kafka_bootstrap", bootstrap, "--keys_dir", str(keys), "--port", str(port), "--spool_dir",
            str(spool), "--reports_topic", topic, "--devices_topic", topic + "-devices", "--rate_per_device", "0",
            "--enrolment", "open"]
    if server == "uvicorn-linger2":  # the edge as shipped before: the producer lingered 2 ms
        (spool.parent / "linger2.cfg").write_text("linger_ms=2\n")
        args += ["--kafka_config", str(spool.parent / "linger2.cfg")]
    if server.startswith("uvicorn"):  # the edge as shipped
        cmd = [sys.executable, "-m", "pipelines.cli", *args]
    else:
        cmd = [sys.executable, "-c", _AIOHTTP_LAUNCH.format(root=str(ROOT), bench=str(ROOT / "benchmarks")), *args]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    assert proc.stdout is not None
    for line in proc.stdout:
        if "listening on" in line:
            break
    threading.Thread(target=proc.stdout.read, daemon=True).start()
    return proc, f"http://127.0.0.1:{port}"


def hey(url: str, body: Path, n: int, c: int) -> dict[str, float]:
    out = subprocess.run([HEY, "-n", str(n), "-c", str(c), "-m", "POST", "-T", "application/octet-stream", "-D",
                          str(body), url + "/v1/reports"], capture_output=True, text=True, check=True).stdout
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))
    p = {int(m.group(1)): float(m.group(2)) * 1000 for m in re.finditer(r"(\d+)% in ([\d.]+) secs", out)}
    codes = {int(m.group(1)): int(m.group(2)) for m in re.finditer(r"\[(\d+)\]\s+(\d+) responses", out)}
    return {"rps": rps, "p50_ms": p.get(50, float("nan")), "p99_ms": p.get(99, float("nan")),
            "ok": codes.get(202, 0), "n": n}


def idle_connections(url: str, n: int) -> list[socket.socket]:
    host, port = url.rsplit("//", 1)[1].split(":")
    socks = []
    for _ in range(n):
        s = socket.create_connection((host, int(port)))
        socks.append(s)
    return socks


def raw_produce(bootstrap: str, topic: str, body: bytes, n: int) -> dict[str, float]:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all",
                         "linger.ms": 2})
    cpu0, t0 = time.process_time(), time.perf_counter()
    for i in range(n):
        while True:
            try:
                producer.produce(topic, body)
                break
            except BufferError:
                producer.poll(0.01)
        if i % 1000 == 0:
            producer.poll(0)
    producer.flush(120)
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    return {"rps": n / wall, "cpu_s_per_record": cpu / n}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=20_000)
    parser.add_argument("--concurrency", type=int, default=50)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--idle_connections", type=int, default=10_000)
    parser.add_argument("--servers", nargs="+", default=["uvicorn", "aiohttp"],
                        help="uvicorn (shipped), aiohttp, uvicorn-linger2 (the shipped edge, its former 2 ms linger)")
    parser.add_argument("--bootstrap", default=None, help="an existing broker (default: start one)")
    args = parser.parse_args()

    import numpy as np

    from transforms.device import Client
    from transforms.spec import spec_from_dict
    from transforms.trust.keys import init_keys, load_analyzer_public, load_shuffler_sealing_public

    work = Path(tempfile.mkdtemp(prefix="esa-edge-bench-"))
    keys = work / "keys"
    init_keys(keys)
    (a_id, a_key), (s_id, s_key) = load_analyzer_public(keys), load_shuffler_sealing_public(keys)
    spec = spec_from_dict({"analysis": {"name": "bench", "kind": "histogram"}, "domain": {"size": 64},
                           "mechanism": {"name": "olh", "epsilon": 2.0}, "window": {"size_seconds": 3600}})
    client = Client(spec, work / "device", rng=np.random.default_rng(1), analyzer_public_key=a_key,
                    analyzer_key_id=a_id, shuffler_public_key=s_key, shuffler_key_id=s_id)
    body = client.encode(5)
    (work / "body.bin").write_bytes(body)
    broker = None if args.bootstrap else LocalBroker().start()
    bootstrap = args.bootstrap or broker.bootstrap
    rows: dict[str, list[dict[str, float]]] = {}
    memory: dict[str, tuple[float, float]] = {}
    try:
        for repeat in range(args.repeats):
            for server in args.servers:
                topic = f"bench-{server}-{repeat}-{os.getpid()}"
                ensure_topics(bootstrap, [topic, topic + "-devices"], partitions=4)
                proc, url = start_edge(server, bootstrap, keys, topic, work / f"spool-{server}-{repeat}")
                try:
                    hey(url, work / "body.bin", 1000, args.concurrency)  # warm-up
                    cpu0, threads0 = _cpu_seconds(proc.pid), _thread_cpu(proc.pid)
                    result = hey(url, work / "body.bin", args.requests, args.concurrency)
                    result["cpu_s_per_request"] = (_cpu_seconds(proc.pid) - cpu0) / args.requests
                    for kind, cpu in _thread_cpu(proc.pid).items():
                        result[f"us_{kind.replace(' ', '_')}"] = (cpu - threads0.get(kind, 0.0)) / args.requests * 1e6
                    result["per_core"] = 1 / result["cpu_s_per_request"]
                    rows.setdefault(server, []).append(result)
                    if repeat == 0 and args.idle_connections:
                        idle = _rss_mb(proc.pid)
                        socks = idle_connections(url, args.idle_connections)
                        time.sleep(2)
                        memory[server] = (idle, _rss_mb(proc.pid))
                        for s in socks:
                            s.close()
                finally:
                    proc.terminate()
                    proc.wait(60)
            raw = raw_produce(bootstrap, f"bench-raw-{repeat}-{os.getpid()}", body, args.requests)
            rows.setdefault("raw Kafka produce", []).append(raw)
            print(json.dumps({k: v[-1] for k, v in rows.items()}), flush=True)
    finally:
        if broker is not None:
            broker.stop()
        shutil.rmtree(work, ignore_errors=True)
    print(f"\n{len(body)}-byte reports, {args.requests} per run, {args.concurrency} connections, "
          f"median of {args.repeats}; load {os.getloadavg()[0]:.1f}")
    print("| server | reports/s (wall) | edge CPU per report (event loop / librdkafka / other threads) | "
          "reports/s per core | p50 ms | p99 ms | 202s | "
          "RSS idle / with idle connections (MB) |")
    for name, results in rows.items():
        med = {k: statistics.median(r[k] for r in results) for k in results[0]}
        mem = memory.get(name)
        mem_text = f"{mem[0]:.0f} / {mem[1]:.0f}" if mem else ""
        if "p50_ms" in med:
            split = " / ".join(f"{med[k]:.0f}" for k in ("us_event_loop", "us_librdkafka", "us_other") if k in med)
            print(f"| {name} | {med['rps']:,.0f} | {med['cpu_s_per_request'] * 1e6:,.0f} us ({split}) | "
                  f"{med['per_core']:,.0f} | {med['p50_ms']:.1f} | {med['p99_ms']:.1f} | "
                  f"{med['ok']:.0f}/{args.requests} | {mem_text} |")
        else:
            print(f"| {name} | {med['rps']:,.0f} | {med['cpu_s_per_record'] * 1e6:,.0f} us (producer) | "
                  f"{1 / med['cpu_s_per_record']:,.0f} | | | | |")


if __name__ == "__main__":
    main()
