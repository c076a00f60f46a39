"""Benchmark: an incremental build under ``shardflow serve`` (+1 input of N), against the served first build.

    python bench/bench_serve.py --corpus DIR --extra FILE    # its own prefect server
    (bench_flow.py runs it too, on its server and corpus)

``shardflow serve CORPUS --name NAME`` registers a deployment without a
schedule; each run is started as a user starts one by hand (``prefect
deployment run``: a flow run created from the deployment, through the API).
Prefect's runner, inside the serving process, polls for it (every second
here: ``PREFECT_RUNNER_POLL_FREQUENCY=1``, 10 s by default) and runs it in a
process of its own, so each served run pays a fresh interpreter's start-up
and imports, as a cron run does. Measured per run, from the server's
records: the flow run's time from creation to its end (what a user waits:
the poll, the process start, the flow) and from its start (Running) to its
end (the flow itself). The ratio is incremental / first build of each.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def _ts(s: str) -> float:
    from datetime import datetime

    return datetime.fromisoformat(s.replace("Z", "+00:00")).timestamp()


def _run_once(server: Any, deployment_id: str, timeout: float = 600) -> dict[str, float]:
    fr = server.request("POST", f"/deployments/{deployment_id}/create_flow_run", {})
    deadline = time.monotonic() + timeout
    while True:
        run = server.request("GET", f"/flow_runs/{fr['id']}")
        if run["state"]["type"] in ("COMPLETED", "FAILED", "CRASHED", "CANCELLED"):
            break
        if time.monotonic() > deadline:
            sys.exit(f"served run {fr['id']} did not end within {timeout:.0f} s")
        time.sleep(0.1)
    if run["state"]["type"] != "COMPLETED":
        sys.exit(f"served run {fr['id']} ended {run['state']['type']}: {run['state'].get('message')}")
    created, start, end = _ts(run["created"]), _ts(run["start_time"]), _ts(run["end_time"])
    return {"created_to_end": end - created, "flow": end - start}


def serve_incremental(server: Any, env: dict[str, str], corpus: Path, extra: Path, work: Path,
                      rounds: int = 1) -> dict[str, list[dict[str, float]]]:
    """``rounds`` pairs of (first build of ``corpus``, the same with ``extra`` added), each run served.

    ``corpus`` is a directory of the inputs as symlinks, where ``extra`` is linked and unlinked.
    """
    name = "serve-inc"
    root = work / "serve"
    link = corpus / f"{'z' * 8}-served-extra{extra.suffix}"  # sorts last: appended, as bench_flow's +1 file
    env = {**env, "PREFECT_RUNNER_POLL_FREQUENCY": "1", "CI": "true"}
    out: dict[str, list[dict[str, float]]] = {"first": [], "incremental": []}
    log = open(work / "serve.log", "wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "shardflow", "serve", str(corpus), "--name", name, "--deployment", name,
         "--data-root", str(root / "data"), "--catalog", str(root / "manifests")],
        env=env, cwd=work, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                deployment = server.request("GET", f"/deployments/name/build-dataset/{name}")
                break
            except Exception:
                if proc.poll() is not None or time.monotonic() > deadline:
                    sys.exit(f"shardflow serve did not register its deployment; see {work / 'serve.log'}")
                time.sleep(0.5)
        for _ in range(rounds):
            shutil.rmtree(root, ignore_errors=True)
            link.unlink(missing_ok=True)
            out["first"].append(_run_once(server, deployment["id"]))
            os.symlink(extra.resolve(), link)
            try:
                out["incremental"].append(_run_once(server, deployment["id"]))
            finally:
                link.unlink()
    finally:
        os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()
    text = (work / "serve.log").read_text(errors="replace")
    out["bad_lines"] = [{"line": l} for l in text.splitlines() if " ERROR " in l or "| ERROR" in l or "Traceback" in l]  # type: ignore[dict-item]
    return out


def report(runs: dict[str, list[dict[str, float]]]) -> list[str]:
    """Markdown rows: medians of each measure, first build, incremental, ratio."""
    import statistics

    rows = []
    for key, label in (("created_to_end", "created to end (poll + process start + flow)"), ("flow", "flow run (Running to end)")):
        a = statistics.median(r[key] for r in runs["first"])
        b = statistics.median(r[key] for r in runs["incremental"])
        rows.append(f"| served run, {label} | {a:.2f} s | {b:.2f} s | {b / a:.2f} |")
    bad = runs.get("bad_lines", [])
    rows.append(f"\nERROR or traceback lines in the serve log: {len(bad)}" + "".join(f"\n  {b['line']}" for b in bad[:5]))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--corpus", type=Path, required=True, help="a directory of Parquet files (make_corpus.py)")
    ap.add_argument("--extra", type=Path, required=True, help="the input added for the incremental run")
    ap.add_argument("--rounds", type=int, default=1)
    args = ap.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from bench_flow import Server, base_env

    work = Path(tempfile.mkdtemp(prefix="shardflow-bench-serve-"))
    linked = work / "corpus"
    linked.mkdir()
    for f in sorted(args.corpus.glob("*.parquet")):
        os.symlink(f.resolve(), linked / f.name)
    server = Server(work)
    try:
        env = {**base_env(), "PREFECT_API_URL": server.url, "PREFECT_HOME": str(work / "client-home")}
        runs = serve_incremental(server, env, linked, args.extra, work, rounds=args.rounds)
    finally:
        server.stop()
    print("| measure | first build | incremental (+1 input) | ratio |\n|---|---:|---:|---:|")
    print("\n".join(report(runs)))


if __name__ == "__main__":
    main()
