"""A small simulation: wall time of a 10 TB build on N Dask workers, from the per-unit costs bench_scale.py measured.

    python bench/bench_scale.py --mb 128 --files 16 --unit-mb 8 --shard-tokens 4000000 --out bench/scale_s3.json
    python bench/simulate_scale.py bench/scale_s3.json

Model (each worker is one core, one job at a time; jobs of a stage are spread
evenly, a stage starts when the one before it ends, as in ``run_stages``):

* plan (the flow's machine): objects planned ``PLAN_THREADS`` at a time, each
  round costing what the measured run's planning cost (its objects were all
  in flight at once), plus the plan's size;
* tokenize-unit: ``ceil(units / N)`` units per worker, each
  ``unit text / measured text rate`` (the rate includes reading the object
  from S3 and hashing it);
* layout (one job, central): ``documents x measured seconds per document``;
* write-shard, validate-shard: ``ceil(shards / N)`` shards per worker at the
  measured token rates;
* finalize + publish: measured, scaled by the number of shards.

Not in the model (not measured here): Prefect's per-task orchestration cost,
network and shared-filesystem bandwidth limits (reported as demands per
worker instead), stragglers and retries.
"""

from __future__ import annotations

import json
import math
import sys

TEXT_TB = 10.0
OBJECT_GB = 0.5  # stored Parquet per object
UNIT_MB = 256  # text per work unit (--unit-bytes)
SHARD_TOKENS = 100_000_000  # the default --shard-tokens
TOKEN_BYTES = 4  # cl100k: uint32 shards
PLAN_THREADS = 32


def main(path: str) -> None:
    r = json.load(open(path))
    one = r["runs"][0]
    st = one["stages"]
    text_mb_measured = r["corpus"]["text_mb"]
    stored_ratio = r["corpus"]["parquet_bytes"] / (text_mb_measured * 2**20)
    text_rate = text_mb_measured / st["tokenize-unit"]["work_s"]  # MB of text per core-second
    tokens_per_mb = one["tokens"] / text_mb_measured
    write_rate = one["tokens"] / st["write-shard"]["work_s"]
    validate_rate = one["tokens"] / st["validate-shard"]["work_s"]
    per_doc = st["layout"]["work_s"] / one["documents"]
    tokens_per_doc = one["tokens"] / one["documents"]
    plan_round = one["plan"]["wall_s"]  # all of its objects in flight at once
    plan_bytes_per_object = one["plan"]["bytes_received"] / one["plan"]["objects"]
    plan_json_per_entry = one["plan_json_bytes"] / (one["plan"]["objects"] + one["plan"]["units"])
    tail_per_shard = (st["validate"]["work_s"] + st["publish"]["work_s"]) / one["shards"]

    text_mb = TEXT_TB * 1e12 / 2**20
    tokens = text_mb * tokens_per_mb
    stored = text_mb * 2**20 * stored_ratio
    objects = math.ceil(stored / (OBJECT_GB * 2**30))
    units = math.ceil(text_mb / UNIT_MB)
    shards = math.ceil(tokens / SHARD_TOKENS)
    docs = tokens / tokens_per_doc
    plan_s = math.ceil(objects / PLAN_THREADS) * plan_round
    layout_s = docs * per_doc
    tail_s = shards * tail_per_shard
    print(f"measured (1 worker, {r['corpus']['text_mb']} MB text, {r['corpus']['objects']} objects, source {r.get('source', 's3')}):")
    print(f"  tokenize-unit {text_rate:.1f} MB text/s/core ({text_rate * tokens_per_mb / 1e6:.2f} M tokens/s/core, read + hash included)")
    print(f"  write-shard {write_rate / 1e6:.1f} M tokens/s/core, validate-shard {validate_rate / 1e6:.1f} M tokens/s/core")
    print(f"  layout {per_doc * 1e6:.2f} us/document; planning {plan_bytes_per_object / 1e3:.0f} kB read per object; "
          f"plan.json {plan_json_per_entry:.0f} B per object or unit")
    print(f"corpus: {TEXT_TB:.0f} TB text = {tokens / 1e12:.2f} T tokens, {docs / 1e9:.2f} G documents, "
          f"{stored / 1e12:.1f} TB Parquet in {objects} objects of {OBJECT_GB} GB; {units} units of {UNIT_MB} MB text; "
          f"{shards} shards of {SHARD_TOKENS / 1e6:.0f} M tokens")
    print(f"central: plan {plan_s / 60:.1f} min ({objects * plan_bytes_per_object / 1e9:.2f} GB of footers, "
          f"plan.json {(objects + units) * plan_json_per_entry / 1e6:.1f} MB), layout {layout_s / 3600:.2f} h, "
          f"finalize+publish {tail_s / 60:.1f} min")
    print(f"{'N':>6} {'tokenize h':>11} {'write h':>8} {'validate h':>11} {'total h':>8} {'central %':>9} "
          f"{'S3 read GB/s':>13} {'FS write GB/s':>14}")
    # Per worker: tokenize reads its objects twice over (the text column, then every byte to hash) and
    # writes its part files; write-shard reads part files and writes shards at the write rate.
    s3_read = 2 * stored_ratio * text_rate * 2**20  # bytes/s per worker while tokenizing
    fs_write = write_rate * TOKEN_BYTES  # bytes/s per worker while writing shards
    for n in (8, 32, 128, 512, 2048, 8192):
        tok_s = math.ceil(units / n) * UNIT_MB / text_rate
        write_s = math.ceil(shards / n) * SHARD_TOKENS / write_rate
        val_s = math.ceil(shards / n) * SHARD_TOKENS / validate_rate
        total = plan_s + tok_s + layout_s + write_s + val_s + tail_s
        central = (plan_s + layout_s + tail_s) / total
        print(f"{n:>6} {tok_s / 3600:>11.2f} {write_s / 3600:>8.2f} {val_s / 3600:>11.2f} {total / 3600:>8.2f} "
              f"{100 * central:>8.0f}% {n * s3_read / 1e9:>13.2f} {n * fs_write / 1e9:>14.1f}")

if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "bench/scale_s3.json")
