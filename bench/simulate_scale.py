"""A small simulation: a 10 TB build on N Dask workers, from the costs bench_scale.py measured; the central part checked.

    python bench/bench_scale.py --mb 128 --files 16 --unit-mb 8 --shard-tokens 4000000 --out bench/scale_s3.json
    python bench/simulate_scale.py bench/scale_s3.json

The corpus: ``TEXT_TB`` of text stored as Parquet at the measured ratio, in
``OBJECT_GB`` objects, cut into units of ``UNIT_MB`` (the default
``--unit-mb``) by the rule of ``sources/cuts.py`` (a last unit under a quarter
joins the one before), each unit's train tokens in pieces of at most
``SHARD_TOKENS`` (the default ``--shard-tokens``), and ``VAL_FRACTION`` of
the documents held out (0.001: a val split of about 2.5 G tokens).

Model (each worker is one core, one job at a time; jobs of a stage are spread
evenly, a stage starts when the one before it ends, as in ``run_stages``):

* planning (the flow's machine; O(objects), reported apart): objects planned
  ``PLAN_THREADS`` at a time, each round costing what the measured run's
  planning cost (its objects were all in flight at once); the footers read
  and the plan's size;
* tokenize-unit: ``ceil(units / N)`` units per worker at the measured text
  rate, which includes reading the object from S3, writing the unit's shard
  pieces (its train shards, final) and hashing the object;
* the central stages, one job each on the flow's machine, from the central
  sweep's least-squares fits (``central_fit``): layout = intercept + s/unit x
  units + s/val document x val documents (the bound: all of a layout's
  seconds charged to its val documents); stats-card = intercept + s/unit x
  units + s/row x the units' vocabulary rows + s/row x vocabulary rows +
  s/object x objects (a record per input); finalize = intercept + s/shard x
  shards + s/row x vocabulary rows (it hashes ``stats.vocab.npy``) + s/object
  x objects; publish = intercept + s/shard x shards. stats-card runs
  beside write-shard and validate-shard: only what it takes beyond them is on
  the critical path. Also a bound: the sweep's largest point's seconds per
  unit (shard) times the units (shards), no intercept;
* vocabulary rows: each unit's statistics hold a row per token id the unit
  uses (stats-card reads them all: units x vocabulary), and ``stats.vocab.npy``
  a row (16 bytes) per input and id the input uses (objects x vocabulary).
  Two figures: the ids a unit and an object of the measured corpus use
  (make_corpus draws from a small pool of paragraphs: a low figure) and the
  tokenizer's whole vocabulary (``VOCAB``, what 100 M tokens of web text come
  near). The per-row costs are fitted with the sweep's wide-vocabulary points
  (78-99 k ids per object), so they are not per-object costs in disguise;
* write-shard: ``ceil(train shards / N)`` hard links at the measured seconds
  per link; the gathered val shards copied, each from one val piece per unit,
  at the sweep's seconds per piece and per token;
* validate-shard (measurements of a tree that read every shard back): ``ceil(shards / N)`` shards per worker
  at the measured rate; none in a measurement without the stage (shards checked as they are written).

Memory on the flow's machine at 10 TB: a process that has imported the
Prefect flow (measured), the loaded tokenizer (measured), the plan held in
memory (the sweep's fit per ``plan.json`` entry, object or unit), and the
largest central stage's peak growth (its fit at 10 TB), the layout's plus
16 bytes per val document for its gathered document starts (read whole to
cut the val shards; from the code, not measured).

Not in the model (not measured here): Prefect's per-task orchestration cost
and the memory its task runs' states take, network and shared-filesystem
bandwidth limits (reported as demands instead), stragglers and retries.
"""

from __future__ import annotations

import json
import math
import sys

TEXT_TB = 10.0
OBJECT_GB = 0.5  # stored Parquet per object
UNIT_MB = 256  # MiB of text per work unit (the default --unit-mb)
SHARD_TOKENS = 100_000_000  # the default --shard-tokens: an upper bound
VAL_FRACTION = 0.001
VOCAB = 100_277  # cl100k_base's ids, special tokens included
TOKEN_BYTES = 4  # cl100k: uint32 shards
PLAN_THREADS = 32
WORKERS = (1, 10, 100, 1000)
CENTRAL_LIMIT_S = 5 * 60
CENTRAL_LIMIT_MB = 2 * 1024
VAL_START_BYTES = 16  # per val document in the layout: the starts file read whole, and its cut


def object_units(object_text_mb: float) -> list[float]:
    """The text MiB of each unit of an object of that much text (``sources/cuts.py``: a small last unit joins the one before)."""
    ranges = max(1, math.ceil(object_text_mb / UNIT_MB))
    if ranges >= 2 and (object_text_mb - (ranges - 1) * UNIT_MB) * 4 < UNIT_MB:
        ranges -= 1
    return [float(UNIT_MB)] * (ranges - 1) + [object_text_mb - (ranges - 1) * UNIT_MB]


def at(f: dict[str, float], **x: float) -> float:
    """A fit's value at ``x`` (``per_NAME`` times ``NAME``, plus the intercept; a term the fit lacks: none)."""
    return f["intercept"] + sum(f.get(f"per_{k}", 0.0) * v for k, v in x.items())


def main(path: str) -> None:
    r = json.load(open(path))
    one = r["runs"][0]
    st = one["stages"]
    sweep = r.get("central_sweep")
    if not sweep:
        sys.exit(f"{path}: no central sweep in this measurement; run bench_scale.py without --central-units ''")
    fit = sweep["central_fit"]
    text_mb_measured = r["corpus"]["text_mb"] * 1e6 / 2**20  # make_corpus's --mb is 10^6 bytes of text
    stored_ratio = r["corpus"]["parquet_bytes"] / (text_mb_measured * 2**20)
    text_rate = text_mb_measured / st["tokenize-unit"]["work_s"]  # MiB of text per core-second
    tokens_per_mb = one["tokens"] / text_mb_measured
    # A measurement without validate-shard (shards checked as they are written): no such time.
    validate_rate = one["tokens"] / st["validate-shard"]["work_s"] if "validate-shard" in st else math.inf
    tokens_per_doc = one["tokens"] / one["documents"]
    link_s = fit["link_s_per_train_shard"]
    copy_per_piece = max(0.0, fit["val_copy_s"]["per_pieces"])
    copy_rate = fit["val_tokens"] / max(fit["val_copy_s"]["intercept"], 1e-9)
    plan_round = one["plan"]["wall_s"]  # all of its objects in flight at once
    plan_bytes_per_object = one["plan"]["bytes_received"] / one["plan"]["objects"]
    plan_json_per_entry = one["plan_json_bytes"] / (one["plan"]["objects"] + one["units"])
    rows_per_object_low = one["stats_vocab"]["rows_per_input_max"]
    rows_per_unit_low = one["stages"]["tokenize-unit"]["vocab_rows"] / one["units"]
    child = sweep["points"][-1]["stages"]["layout"]
    tokenizer_mb = child["process_mb_before"] - child["interpreter_mb"] - child["imports_mb"] - child["plan_mb"]

    # The corpus at 10 TB.
    text_mb = TEXT_TB * 1e12 / 2**20
    tokens = text_mb * tokens_per_mb
    stored = text_mb * 2**20 * stored_ratio
    objects = math.ceil(stored / (OBJECT_GB * 2**30))
    unit_mbs = object_units(text_mb / objects)
    units = objects * len(unit_mbs)
    docs = tokens / tokens_per_doc
    val_docs = docs * VAL_FRACTION
    val_tokens = tokens * VAL_FRACTION
    # A unit's train tokens in pieces of at most SHARD_TOKENS (whole documents: at least this many).
    pieces = [math.ceil(mb * tokens_per_mb * (1 - VAL_FRACTION) / SHARD_TOKENS) for mb in unit_mbs]
    train_shards = objects * sum(pieces)
    val_shards = math.ceil(val_tokens / SHARD_TOKENS)
    shards = train_shards + val_shards

    # The flow's machine, for each figure of the vocabulary rows.
    plan_s = math.ceil(objects / PLAN_THREADS) * plan_round
    layout_s = at(fit["layout_s"], units=units) + fit["layout_s_per_val_doc_bound"] * val_docs
    pub_s = at(fit["publish_s"], shards=shards)
    held_plan_mb = max(0.0, at(fit["plan_mb"], entries=units + objects))
    cases = {}
    for name, per_object, per_unit in (("low", rows_per_object_low, rows_per_unit_low), ("high", VOCAB, VOCAB)):
        rows = objects * per_object
        unit_rows = units * per_unit
        card_s = at(fit["stats_card_s"], units=units, unit_rows=unit_rows, vocab_rows=rows, objects=objects)
        fin_s = at(fit["finalize_s"], shards=shards, vocab_rows=rows, objects=objects)
        bound = (fit["layout_s_per_unit_bound"] * units + fit["layout_s_per_val_doc_bound"] * val_docs
                 + fit["stats_card_s_per_unit_bound"] * units
                 + at(fit["stats_card_s"], unit_rows=unit_rows, vocab_rows=rows, objects=objects) - fit["stats_card_s"]["intercept"]
                 + fit["finalize_s_per_shard_bound"] * shards
                 + at(fit["finalize_s"], vocab_rows=rows, objects=objects) - fit["finalize_s"]["intercept"])
        stage_mb = {
            "layout": at(fit["layout_mb"], units=units) + VAL_START_BYTES * val_docs / 2**20,
            "stats-card": at(fit["stats_card_mb"], units=units, vocab_rows=rows, objects=objects),
            "finalize": at(fit["finalize_mb"], shards=shards, vocab_rows=rows, objects=objects),
        }
        top = max(stage_mb, key=lambda k: stage_mb[k])
        flow_mb = r["flow_process_mb"] + tokenizer_mb + held_plan_mb + stage_mb[top]
        cases[name] = dict(per_object=per_object, per_unit=per_unit, rows=rows, card_s=card_s, fin_s=fin_s, bound=bound,
                           central=layout_s + card_s + fin_s, stage_mb=stage_mb, top=top, flow_mb=flow_mb)

    print(f"measured (1 worker, {r['corpus']['text_mb']} MB text, {r['corpus']['objects']} objects, "
          f"source {r.get('source', 's3')}; load average at the end {r['load_avg_at_end'][0]:.1f} on {r['cpus']} cores):")
    print(f"  tokenize-unit {text_rate:.1f} MiB text/s/core ({text_rate * tokens_per_mb / 1e6:.2f} M tokens/s/core; "
          "read + write the unit's shards + hash included)")
    print(f"  write-shard {link_s * 1e3:.2f} ms per train shard (a hard link); a val shard copied at "
          f"{copy_per_piece * 1e3:.3f} ms per piece + {copy_rate / 1e6:.0f} M tokens/s; "
          f"validate-shard {validate_rate / 1e6:.1f} M tokens/s/core")
    print(f"  planning {plan_bytes_per_object / 1e3:.0f} kB read per object; plan.json {plan_json_per_entry:.0f} B per object or unit")
    pts = sweep["points"]
    print(f"central sweep ({sweep['corpus']['text_mb']:g} MB text; points of (objects, units, shards): "
          f"{', '.join(str((p['objects'], p['units'], p['shards'])) for p in pts)}), least squares:")
    print(f"  layout      {fit['layout_s']['intercept']:.3f} s + {fit['layout_s']['per_units'] * 1e3:.3f} ms/unit "
          f"(bound {fit['layout_s_per_unit_bound'] * 1e3:.3f}); val documents <= "
          f"{fit['layout_s_per_val_doc_bound'] * 1e6:.2f} us each (the bound used; the val documents alone: "
          + ("n/a" if fit["layout_s_per_val_doc"] is None else f"{fit['layout_s_per_val_doc'] * 1e6:.2f} us") + ")")
    print(f"  stats-card  {fit['stats_card_s']['intercept']:.3f} s + {fit['stats_card_s']['per_units'] * 1e3:.3f} ms/unit "
          f"(bound {fit['stats_card_s_per_unit_bound'] * 1e3:.3f}) + {fit['stats_card_s']['per_unit_rows'] * 1e9:.0f} ns/unit "
          f"vocabulary row + {fit['stats_card_s']['per_vocab_rows'] * 1e9:.0f} ns/vocabulary row + "
          f"{fit['stats_card_s'].get('per_objects', 0.0) * 1e3:.3f} ms/object")
    print(f"  finalize    {fit['finalize_s']['intercept']:.3f} s + {fit['finalize_s']['per_shards'] * 1e3:.3f} ms/shard "
          f"(bound {fit['finalize_s_per_shard_bound'] * 1e3:.3f}) + {fit['finalize_s']['per_vocab_rows'] * 1e9:.0f} ns/vocabulary row + "
          f"{fit['finalize_s'].get('per_objects', 0.0) * 1e3:.3f} ms/object")
    print(f"  publish     {fit['publish_s']['intercept']:.3f} s + {fit['publish_s']['per_shards'] * 1e3:.3f} ms/shard")
    print(f"  peak memory growth: layout {fit['layout_mb']['intercept']:.1f} MB + {fit['layout_mb']['per_units'] * 1e3:.2f} kB/unit; "
          f"stats-card {fit['stats_card_mb']['intercept']:.1f} MB + {fit['stats_card_mb']['per_units'] * 1e3:.2f} kB/unit + "
          f"{fit['stats_card_mb']['per_vocab_rows'] * 2**20:.1f} B/vocabulary row + "
          f"{fit['stats_card_mb'].get('per_objects', 0.0) * 1e3:.2f} kB/object; finalize "
          f"{fit['finalize_mb']['intercept']:.1f} MB + {fit['finalize_mb']['per_shards'] * 1e3:.2f} kB/shard + "
          f"{fit['finalize_mb']['per_vocab_rows'] * 2**20:.1f} B/vocabulary row + "
          f"{fit['finalize_mb'].get('per_objects', 0.0) * 1e3:.2f} kB/object; plan held "
          f"{fit['plan_mb']['per_entries'] * 2**20:.0f} B per unit or object")
    print(f"corpus: {TEXT_TB:.0f} TB text = {tokens / 1e12:.2f} T tokens, {docs / 1e9:.2f} G documents "
          f"({val_docs / 1e6:.2f} M val at {VAL_FRACTION}), {stored / 1e12:.1f} TB Parquet in {objects} objects of "
          f"{OBJECT_GB} GB; {units} units ({' + '.join(f'{mb:.0f}' for mb in unit_mbs)} MiB text per object = "
          f"{' + '.join(f'{mb * tokens_per_mb / 1e6:.0f}' for mb in unit_mbs)} M tokens: {' + '.join(map(str, pieces))} "
          f"train shards); {train_shards} train shards ({tokens * (1 - VAL_FRACTION) / train_shards / 1e6:.0f} M tokens "
          f"on average) + {val_shards} val shards")
    print(f"planning, O(objects), apart: {plan_s / 60:.1f} min ({objects * plan_bytes_per_object / 1e9:.2f} GB of footers, "
          f"plan.json {(objects + units) * plan_json_per_entry / 1e6:.1f} MB)")
    for name, c in cases.items():
        print(f"central at 10 TB, {c['per_unit']:.0f} token ids used per unit and {c['per_object']} per object ({name}: "
              f"{c['rows'] / 1e6:.0f} M rows, stats.vocab.npy {c['rows'] * 16 / 1e9:.1f} GB): layout {layout_s:.1f} s, "
              f"stats-card {c['card_s']:.1f} s, finalize {c['fin_s']:.1f} s = {c['central'] / 60:.2f} min "
              f"(bound {c['bound'] / 60:.2f}); publish {pub_s:.1f} s")
        print(f"  flow's machine memory: {c['flow_mb']:.0f} MB = Prefect flow process {r['flow_process_mb']:.0f} + "
              f"tokenizer {tokenizer_mb:.0f} + plan {held_plan_mb:.0f} + {c['top']} {c['stage_mb'][c['top']]:.0f} "
              f"(layout {c['stage_mb']['layout']:.0f}, stats-card {c['stage_mb']['stats-card']:.0f}, "
              f"finalize {c['stage_mb']['finalize']:.0f})")
        ok_s = max(c["central"], c["bound"]) <= CENTRAL_LIMIT_S
        ok_mb = c["flow_mb"] <= CENTRAL_LIMIT_MB
        for n in WORKERS:  # the central part does not depend on N
            print(f"  N = {n:>4}: layout + stats + finalize {c['central'] / 60:.2f} min (bound {c['bound'] / 60:.2f}) "
                  f"<= 5 min: {'yes' if ok_s else 'NO'}; {c['flow_mb'] / 1024:.2f} GB <= 2 GB: {'yes' if ok_mb else 'NO'}")

    low = cases["low"]
    print("wall time (the low vocabulary figure), hours; central = planning + layout + stats-card beyond the shard "
          "jobs + finalize + publish:")
    print(f"{'N':>6} {'tokenize h':>11} {'write h':>8} {'validate h':>11} {'total h':>8} {'central %':>9} "
          f"{'S3 read GB/s':>13} {'FS write GB/s':>14}")
    # Per worker: tokenize reads its objects twice over (the text column, then every byte to hash) and writes
    # its unit's shards, 4 bytes a token, as it goes; write-shard writes only the val copies.
    s3_read = 2 * stored_ratio * text_rate * 2**20  # bytes/s per worker while tokenizing
    fs_write = text_rate * tokens_per_mb * TOKEN_BYTES  # bytes/s per worker while tokenizing
    val_copy_s = (units / val_shards) * copy_per_piece + (val_tokens / val_shards) / copy_rate  # one val shard
    for n in WORKERS:
        tok_s = math.ceil(units / n) * UNIT_MB / text_rate
        write_s = math.ceil(train_shards / n) * link_s + math.ceil(val_shards / n) * val_copy_s
        val_s = math.ceil(shards / n) * (tokens / shards) / validate_rate
        beside = max(0.0, low["card_s"] - write_s - val_s)
        central = plan_s + layout_s + beside + low["fin_s"] + pub_s
        total = tok_s + write_s + val_s + central
        print(f"{n:>6} {tok_s / 3600:>11.2f} {write_s / 3600:>8.3f} {val_s / 3600:>11.3f} {total / 3600:>8.2f} "
              f"{100 * central / total:>8.1f}% {n * s3_read / 1e9:>13.2f} {n * fs_write / 1e9:>14.2f}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "bench/scale_s3.json")
