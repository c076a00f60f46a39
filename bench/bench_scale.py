"""Benchmark: a build from ``s3://`` on a Dask cluster of 1 and then 2 worker processes; per-unit and central costs.

    python bench/bench_scale.py                     # 32 MB Parquet corpus, 8 objects, on loopback S3 (moto)
    python bench/bench_scale.py --mb 64 --files 16 --unit-mb 4 --out scale.json
    python bench/bench_scale.py --central-units ""  # without the central sweep (below)

The corpus (``make_corpus.py``) is put on a loopback S3 server (moto's
``ThreadedMotoServer``, reached through ``AWS_ENDPOINT_URL`` like any S3
store). For each cluster size a fresh ``distributed.LocalCluster`` of N
single-threaded worker processes runs the build's stage table
(``shardflow.pipeline.STAGES``) with ``run_stages``, one Dask task per job of a
fanned-out stage (as ``DaskExecutor`` does: the plan travels as a
``PlanHandle``), without Prefect's overhead, so what is measured is the work
itself. Reported, as JSON on stdout:

* planning on this process: wall seconds, objects, and bytes received from
  the S3 server while planning (a counting proxy in front of it);
* per stage: wall seconds and the summed per-job seconds (work seconds); for
  the per-shard stages also per split (write-shard links a train shard and
  copies a gathered val shard, so the two cost differently);
* the central stages (layout, stats-card, validate = ``finalize``), the
  one-job stages that run on the flow's machine: each runs in a fresh
  process that has loaded the plan and the tokenizer (as the flow's process
  has since planning), which reports the stage's seconds and its peak
  memory growth (Linux's ``VmHWM`` after the stage minus the
  resident memory before it, the peak reset there), with the
  units and shards it handled;
* per-core rates from the 1-worker run: text MB/s and tokens/s per core for
  tokenize-unit (which includes reading the object from S3, writing the
  unit's shard pieces, checking and hashing them), tokens/s of validate-shard in a tree that has that stage
  (shards are checked as they are written since: no such stage);
* the speed-up of 2 workers over 1 on the whole build.

The central sweep (``--central-units``) then shows how the central stages
grow: one small local corpus (``--central-mb``, row groups of 4 documents)
built with unit sizes that cut it into about each number of units given,
the tokenize and shard jobs in this process, the central stages measured as
above. Same text, so documents and tokens stay fixed while units and shards
grow. The same text in more objects (``--central-objects``, at the middle
unit count) grows the per-input statistics (``stats.vocab.npy``: a row per
input and token id it uses). One more point at the smallest unit count with
a lower ``val_fraction`` varies the val documents alone (the layout gathers
val pieces by their ``.bos.idx``: O(val documents)). ``make_corpus`` draws
from a small pool of paragraphs, so its units and objects use about 23 k
token ids whatever their size, and its vocabulary rows grow in step with its
objects. So the same amount of text of random cl100k tokens, decoded
(``--central-wide``: 78-99 k ids per object, as web text uses), in a few
object counts at the smallest unit count, varies the rows per object and per
unit apart from the objects and units. ``central_fit`` holds the
least-squares fits: seconds and MB against units or shards, objects (the
per-input records), and vocabulary rows (of the units, of ``stats.vocab.npy``).

Each worker process is limited to one core for tokenizing (``RAYON_NUM_THREADS=1``:
gigatoken's batch encode otherwise spreads over every core), so the 1-worker
rates are per-core rates. The S3 server runs in this benchmark's process, on
the same cores: on a shared 2-core machine the 2-worker figure is a lower
bound on scaling.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "src"), str(ROOT), str(ROOT / "tests")]
MAKE_CORPUS = ROOT.parent / "shared" / "tools" / "make_corpus.py"

CENTRAL = ("layout", "stats-card", "validate")
"""The one-job stages whose cost the flow's machine pays, whatever the number of workers (planning aside)."""
SWEEP_VAL_FRACTION = 0.3  # most of the sweep's small units get a val piece, as every 384 MiB unit does at scale
SWEEP_LOW_VAL_FRACTION = 0.05


def _memory_mb(field: str) -> float:
    """``VmHWM`` (peak resident memory since exec or the last reset) or ``VmRSS`` (now) of this process, Linux's.

    Not ``ru_maxrss``: Linux carries it over from the parent through fork and exec, so a child of a large
    process starts at its parent's figure.
    """
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024  # kB
    raise RuntimeError(f"no {field} in /proc/self/status: this benchmark measures memory on Linux only")


def _reset_peak() -> None:
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS (Linux 4.0+, documented in proc(5))


def central_child(name: str, staging: str) -> None:
    """In a fresh process: run the central stage ``name`` on the staged build, print its cost as one JSON line."""
    base = _memory_mb("VmRSS")
    from shardflow.pipeline import load_plan, stage
    from shardflow.tokenizers import load_tokenizer

    imported = _memory_mb("VmRSS")
    plan = load_plan(staging)
    planned = _memory_mb("VmRSS")
    # The flow's process has the tokenizer since planning (it resolves the dtype and boundaries): not this stage's.
    load_tokenizer(plan.config.tokenizer, backend=plan.config.backend)
    # The peak is measured from here: loading the tokenizer's peak above its resident size is not the stage's.
    _reset_peak()
    before = _memory_mb("VmRSS")
    t0 = time.perf_counter()
    stage(name)(plan)
    seconds = time.perf_counter() - t0
    print(json.dumps({
        "work_s": seconds,
        "peak_growth_mb": _memory_mb("VmHWM") - before,
        "process_mb_before": before,
        "interpreter_mb": base,
        "imports_mb": imported - base,
        "plan_mb": planned - imported,
    }))


def run_central(name: str, staging: str) -> dict[str, Any]:
    """Run a central stage in a fresh process (``central_child``); its cost."""
    proc = subprocess.run(
        [sys.executable, __file__, "--central-child", name, staging], capture_output=True, text=True
    )
    if proc.returncode:
        raise RuntimeError(f"the {name} stage failed in its measuring process:\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _timed(name: str, handle: Any, job: tuple) -> tuple[Any, float]:  # on a worker: the result and its seconds
    from shardflow.pipeline import stage

    t0 = time.perf_counter()
    result = stage(name)(handle.plan, *job)
    return result, time.perf_counter() - t0


def _committed(name: str, plan: Any) -> Any:
    """A central stage's result, committed by its measuring process: read back, not redone."""
    from shardflow.pipeline import stage
    from shardflow.pipeline.staging import Staging
    from shardflow.manifest import read_manifest

    if name == "validate":
        return read_manifest(Staging(plan.staging).out)  # finalize writes it; calling finalize again would redo it
    return stage(name)(plan)  # make_layout and draw_card return their committed output


def _unit_vocab_rows(plan: Any) -> int:
    """The rows of every unit's token counts (``parts/unit-N.stats.npz``'s ``vocab``: one per id the unit uses)."""
    import numpy as np

    from shardflow.pipeline.staging import Staging

    staging = Staging(plan.staging)
    rows = 0
    for u in range(len(plan.units)):
        with np.load(staging.unit_files(u)[0].with_suffix(".stats.npz")) as z:  # the name pipeline/collect_stats.py documents
            rows += len(z["vocab"])
    return rows


def stage_runner(plan: Any, stages: dict[str, dict], map_jobs: Callable | None = None) -> Callable:
    """``run_jobs`` for ``run_stages``: fanned-out jobs by ``map_jobs`` (Dask) or here; central stages measured."""
    from shardflow.pipeline import PlanHandle

    handle = PlanHandle(plan)

    def run_jobs(stage, jobs):
        t = time.perf_counter()
        if stage.name in CENTRAL:
            cost = run_central(stage.name, plan.staging)
            result = _committed(stage.name, plan)
            stages[stage.name] = {"jobs": len(jobs), "wall_s": time.perf_counter() - t, **cost}
            return [result]
        if stage.fan_out == "one" or map_jobs is None:
            out = [_timed(stage.name, handle, job) for job in jobs]
        else:
            out = map_jobs(stage.name, handle, jobs)
        rec = {"jobs": len(jobs), "wall_s": time.perf_counter() - t, "work_s": sum(s for _, s in out)}
        if stage.name == "tokenize-unit":
            rec["vocab_rows"] = _unit_vocab_rows(plan)
        if stage.fan_out == "shards":
            by_split: dict[str, dict] = {}
            for job, (_, s) in zip(jobs, out):
                e = by_split.setdefault(job[0], {"jobs": 0, "work_s": 0.0})
                e["jobs"] += 1
                e["work_s"] += s
            rec["by_split"] = by_split
        stages[stage.name] = rec
        return [r for r, _ in out]

    return run_jobs


def _counts(plan: Any, manifest: Any, plan_json_bytes: int) -> dict[str, Any]:
    splits = {
        name: {"shards": len(s.shards), "tokens": s.tokens, "documents": s.documents}
        for name, s in manifest.splits.items()
    }
    return {
        "units": len(plan.units),
        "shards": sum(s["shards"] for s in splits.values()),
        "tokens": manifest.totals["tokens"],
        "documents": manifest.totals["documents"],
        "splits": splits,
        "plan_json_bytes": plan_json_bytes,
    }


def _plan_json_bytes(plan: Any) -> int:
    return (Path(plan.staging) / "plan.json").stat().st_size  # read before publish removes the staging directory


def run(n_workers: int, url: str, work: Path, s3_env: dict[str, str], options: dict) -> dict:
    import distributed

    from shardflow.pipeline import build_lock, plan_build, run_stages
    from shardflow.config import BuildConfig
    from support.s3 import CountingProxy, environment

    config = BuildConfig(name=f"scale{n_workers}", sources=(url,), **options)
    proxy = CountingProxy(s3_env["AWS_ENDPOINT_URL"])
    with environment({"AWS_ENDPOINT_URL": proxy.endpoint}):
        t0 = time.perf_counter()
        plan = plan_build(config, data_root=work / f"data{n_workers}", catalog=work / f"cat{n_workers}")
        plan_s = time.perf_counter() - t0
    proxy.close()
    plan_json = _plan_json_bytes(plan)
    stages: dict[str, dict] = {}
    with distributed.LocalCluster(
        n_workers=n_workers, threads_per_worker=1, processes=True, dashboard_address=None, host="127.0.0.1"
    ) as cluster, distributed.Client(cluster) as client:
        client.run(lambda: __import__("shardflow.pipeline"))  # imports are not part of the work

        def map_jobs(name, handle, jobs):
            n = len(jobs)
            return client.gather(client.map(_timed, [name] * n, [handle] * n, list(jobs), pure=False))

        t0 = time.perf_counter()
        with build_lock(plan) as plan:
            done = run_stages(plan, stage_runner(plan, stages, map_jobs))
        build_s = time.perf_counter() - t0
    return {
        "workers": n_workers,
        "plan": {"wall_s": plan_s, "objects": len(plan.inputs), "units": len(plan.units), "bytes_received": proxy.received},
        "build_wall_s": build_s,
        **_counts(plan, done["validate"][0], plan_json),
        "stats_vocab": _vocab_rows(done["publish"][0], work / f"cat{n_workers}"),
        "stages": stages,
    }


def _vocab_rows(ref: str, catalog: Path) -> dict[str, int]:
    """The published ``stats.vocab.npy`` of ``ref``: one row per input and token id it uses (16 bytes each)."""
    import numpy as np

    from shardflow.catalog import resolve_ref
    from shardflow.stats import VOCAB_NAME

    path = resolve_ref(ref, catalog=catalog) / VOCAB_NAME
    rows = np.load(path, mmap_mode="r")
    per_input = np.bincount(np.asarray(rows["input"], dtype=np.int64))
    return {"rows": int(len(rows)), "bytes": path.stat().st_size, "inputs": int(len(per_input)),
            "rows_per_input_max": int(per_input.max(initial=0))}


def sweep_point(corpus: Path, work: Path, name: str, unit_bytes: int, val_fraction: float) -> dict:
    """A local build of ``corpus`` in units of ``unit_bytes``, the fanned-out jobs here; the central costs."""
    from shardflow.pipeline import build_lock, plan_build, run_stages
    from shardflow.config import BuildConfig

    config = BuildConfig(name=name, sources=(str(corpus),), unit_bytes=unit_bytes, val_fraction=val_fraction)
    catalog = work / f"{name}-cat"
    plan = plan_build(config, data_root=work / name, catalog=catalog)
    plan_json = _plan_json_bytes(plan)
    stages: dict[str, dict] = {}
    t0 = time.perf_counter()
    with build_lock(plan) as plan:
        done = run_stages(plan, stage_runner(plan, stages))
    return {
        "val_fraction": val_fraction,
        "unit_bytes": config.unit_bytes,
        "objects": len(plan.inputs),
        "build_wall_s": time.perf_counter() - t0,
        **_counts(plan, done["validate"][0], plan_json),
        "stats_vocab": _vocab_rows(done["publish"][0], catalog),
        "stages": stages,
    }


def fit(ys: list[float], **xs: list[float]) -> dict[str, float]:
    """Least-squares ``y = intercept + sum(per_NAME * NAME)`` over the points, no cost below zero.

    A term whose coefficient comes out negative (timing noise where it costs next to nothing) is
    dropped (0) and the rest fitted again, as non-negative least squares would.
    """
    import numpy as np

    y = np.asarray(ys, dtype=float)
    names = ["intercept", *(f"per_{k}" for k in xs)]
    columns = [np.ones(len(ys))] + [np.asarray(v, dtype=float) for v in xs.values()]
    kept = list(range(len(names)))
    while True:
        coef = np.linalg.lstsq(np.column_stack([columns[i] for i in kept]), y, rcond=None)[0]
        if coef.min() >= 0 or len(kept) == 1:
            break
        del kept[int(np.argmin(coef))]
    out = dict.fromkeys(names, 0.0)
    out.update({names[i]: float(c) for i, c in zip(kept, coef)})
    return out


def _corpus(work: Path, mb: float, files: int) -> Path:
    out = work / f"sweep-corpus-{files}"
    subprocess.run([sys.executable, str(MAKE_CORPUS), str(out), "--mb", str(mb), "--files", str(files),
                    "--rows-per-group", "4"], check=True)
    return out


def _wide_corpus(work: Path, mb: float, files: int) -> Path:
    """``mb`` MB of text of random cl100k tokens, decoded, in ``files`` Parquet objects (row groups of 4 documents).

    Documents of 1,000 random ids (seeded) use most of the vocabulary: about 78 k ids in 1 MB of
    text, 99 k in 8 MB, where ``make_corpus``'s pooled paragraphs use about 23 k however much.
    """
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    from shardflow.tokenizers import load_tokenizer

    tokenizer = load_tokenizer("cl100k_base")
    rng = np.random.default_rng(0)
    out = work / f"sweep-wide-{files}"
    out.mkdir()
    for f in range(files):
        texts: list[str] = []
        size = 0
        while size < mb * 1e6 / files:
            # Ids below the first special token (100,256): a special token's bytes do not decode.
            text = tokenizer.decode_bytes(rng.integers(0, 100_256, 1_000)).decode("utf-8", errors="replace")
            texts.append(text)
            size += len(text.encode("utf-8"))
        pq.write_table(pa.table({"text": texts}), out / f"part-{f:05d}.parquet", row_group_size=4)
    return out


def central_sweep(work: Path, mb: float, unit_counts: list[int], object_counts: list[int], wide_counts: list[int]) -> dict:
    text_bytes = int(mb * 1e6)  # make_corpus's --mb is the text size, in 10^6 bytes
    corpus = _corpus(work, mb, 4)
    points = [sweep_point(corpus, work, f"units{u}", max(1, text_bytes // u), SWEEP_VAL_FRACTION) for u in unit_counts]
    # The same text in more objects (units about the middle count): the per-input statistics grow with objects.
    middle = sorted(unit_counts)[len(unit_counts) // 2]
    for files in object_counts:
        points.append(sweep_point(_corpus(work, mb, files), work, f"objects{files}", max(1, text_bytes // middle),
                                  SWEEP_VAL_FRACTION))
    low = min(unit_counts)
    # Text that uses most of the vocabulary, in large units: rows per object and per unit near web text's,
    # so the per-row costs are not confounded with the per-object and per-unit ones.
    for files in wide_counts:
        points.append(sweep_point(_wide_corpus(work, mb, files), work, f"wide{files}", max(1, text_bytes // low),
                                  SWEEP_VAL_FRACTION))
    low_val = sweep_point(corpus, work, f"units{low}-lowval", max(1, text_bytes // low), SWEEP_LOW_VAL_FRACTION)
    same = points[unit_counts.index(low)]

    def col(stage: str, key: str = "work_s") -> list[float]:
        return [p["stages"][stage][key] for p in points]

    units = [p["units"] for p in points]
    shards = [p["shards"] for p in points]
    objects = [p["objects"] for p in points]
    rows = [p["stats_vocab"]["rows"] for p in points]
    unit_rows = [p["stages"]["tokenize-unit"]["vocab_rows"] for p in points]
    top = max(range(len(points)), key=lambda i: units[i])
    link = [p["stages"]["write-shard"]["by_split"]["train"] for p in points]
    pooled = points[: len(unit_counts) + len(object_counts)]  # make_corpus's text: the same val tokens at each
    val_copy = [p["stages"]["write-shard"]["by_split"]["val"]["work_s"] for p in pooled]
    val_docs = same["splits"]["val"]["documents"] - low_val["splits"]["val"]["documents"]
    extra_s = same["stages"]["layout"]["work_s"] - low_val["stages"]["layout"]["work_s"]
    return {
        "corpus": {"text_mb": mb, "objects": [4, *object_counts], "wide_objects": wide_counts, "rows_per_group": 4},
        "points": points,
        "low_val_point": low_val,
        "central_fit": {
            "layout_s": fit(col("layout"), units=units),
            "layout_mb": fit(col("layout", "peak_growth_mb"), units=units),
            # stats.vocab.npy has a row per input and token id it uses: what grows with objects x vocabulary;
            # each unit's token counts, a row per id it uses: units x vocabulary; and a record per input
            # (stats.json's, the manifest's): objects.
            "stats_card_s": fit(col("stats-card"), units=units, unit_rows=unit_rows, vocab_rows=rows, objects=objects),
            "stats_card_mb": fit(col("stats-card", "peak_growth_mb"), units=units, vocab_rows=rows, objects=objects),
            "finalize_s": fit(col("validate"), shards=shards, vocab_rows=rows, objects=objects),
            "finalize_mb": fit(col("validate", "peak_growth_mb"), shards=shards, vocab_rows=rows, objects=objects),
            "publish_s": fit(col("publish"), shards=shards),
            "plan_mb": fit(col("layout", "plan_mb"), entries=[p["units"] + p["objects"] for p in points]),
            # Bounds: the point with the most units, all of its seconds charged to its units (shards).
            "layout_s_per_unit_bound": points[top]["stages"]["layout"]["work_s"] / units[top],
            "stats_card_s_per_unit_bound": points[top]["stages"]["stats-card"]["work_s"] / units[top],
            "finalize_s_per_shard_bound": points[top]["stages"]["validate"]["work_s"] / shards[top],
            "link_s_per_train_shard": sum(e["work_s"] for e in link) / sum(e["jobs"] for e in link),
            # A gathered val shard reads one val piece per unit (the val tokens are about the same at every point).
            "val_copy_s": fit(val_copy, pieces=[p["units"] for p in pooled]),
            "val_tokens": same["splits"]["val"]["tokens"],
            # The val documents alone varied (same units): the layout's extra seconds per val document. On a
            # small corpus this is near the timing noise; the bound (all of the layout's time charged to its
            # val documents) is the safe figure.
            "layout_s_per_val_doc": extra_s / val_docs if val_docs > 0 else None,
            "layout_s_per_val_doc_bound": same["stages"]["layout"]["work_s"] / max(1, same["splits"]["val"]["documents"]),
        },
    }


def flow_process_mb() -> float:
    """Peak memory of a process that has imported the Prefect flow (what the flow's process holds before any work)."""
    code = f"import shardflow.flows.build, runpy; print(runpy.run_path({__file__!r})['_memory_mb']('VmHWM'))"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return float(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    if len(sys.argv) == 4 and sys.argv[1] == "--central-child":
        central_child(sys.argv[2], sys.argv[3])
        return
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mb", type=int, default=32)
    ap.add_argument("--files", type=int, default=8)
    ap.add_argument("--unit-mb", type=int, default=4)
    ap.add_argument("--shard-tokens", type=int, default=2_000_000)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--source", choices=("s3", "local"), default="s3", help="build from the S3 server, or from the local copy")
    ap.add_argument("--central-mb", type=float, default=32, help="text MB of the central sweep's corpus")
    ap.add_argument("--central-units", default="60,250,1000",
                    help="unit counts of the central sweep, comma-separated ('' skips it)")
    ap.add_argument("--central-objects", default="32,256",
                    help="object counts of the central sweep's same text at the middle unit count, comma-separated")
    ap.add_argument("--central-wide", default="4,32",
                    help="object counts of the central sweep's wide-vocabulary text (random cl100k tokens) at the "
                         "smallest unit count, comma-separated ('' leaves it out)")
    args = ap.parse_args()
    from support.s3 import S3Server, environment

    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        corpus = work / "corpus"
        subprocess.run([sys.executable, str(MAKE_CORPUS), str(corpus), "--mb", str(args.mb), "--files", str(args.files)], check=True)
        corpus_bytes = sum(p.stat().st_size for p in corpus.glob("*.parquet"))
        server = S3Server()
        fs = server.fs()
        fs.mkdir("corpus")
        for p in sorted(corpus.glob("*.parquet")):
            fs.put_file(str(p), f"corpus/c/{p.name}")
        options = dict(shard_tokens=args.shard_tokens, unit_bytes=args.unit_mb << 20, val_fraction=0.01)
        results = []
        # The workers, spawned by LocalCluster, inherit the S3 endpoint; and one core each: gigatoken's
        # batch encode would otherwise use every core of the machine in each worker (rayon's pool).
        with environment({**server.env, "RAYON_NUM_THREADS": "1"}):
            url = "s3://corpus/c/" if args.source == "s3" else str(corpus)
            for n in (1, 2):
                results.append(run(n, url, work, server.env, options))
        server.stop()
        counts = [int(c) for c in args.central_units.split(",") if c.strip()]
        objects = [int(c) for c in args.central_objects.split(",") if c.strip()]
        wide = [int(c) for c in args.central_wide.split(",") if c.strip()]
        sweep = central_sweep(work, args.central_mb, counts, objects, wide) if counts else None
    one = results[0]
    text_mb = args.mb  # make_corpus's --mb is the text size
    tok = one["stages"]["tokenize-unit"]
    per_core = {
        "tokenize_text_mb_s": text_mb / tok["work_s"],
        "tokenize_tokens_s": one["tokens"] / tok["work_s"],
    }
    if "validate-shard" in one["stages"]:  # a tree that reads every shard back after writing it
        per_core["validate_tokens_s"] = one["tokens"] / one["stages"]["validate-shard"]["work_s"]
    write = one["stages"]["write-shard"]["by_split"]
    if "val" in write:  # a gathered val shard is copied from the pieces
        per_core["copy_val_tokens_s"] = one["splits"]["val"]["tokens"] / write["val"]["work_s"]
    per_core["link_s_per_train_shard"] = write["train"]["work_s"] / write["train"]["jobs"]
    report = {
        "command": " ".join([os.path.relpath(sys.executable), *sys.argv]),
        "cpus": os.cpu_count(),
        "load_avg_at_end": os.getloadavg(),
        "source": args.source,
        "corpus": {"text_mb": args.mb, "objects": args.files, "parquet_bytes": corpus_bytes},
        "runs": results,
        "per_core_from_1_worker": per_core,
        "speedup_2_over_1": results[0]["build_wall_s"] / results[1]["build_wall_s"],
        "flow_process_mb": flow_process_mb(),
        "central_sweep": sweep,
    }
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
