"""Bad input on every command: exit 2 and a message that names the value, never a traceback or a hang.

ROWS is a table of (id, argv, expected exit code, message fragments). `{name}` in an argv is a file the
`files` fixture makes (a directory, corrupt TOML sweeps, malformed safetensors, a damaged study folder);
in a fragment it stands for that file's base name. Every row runs through typer's CliRunner in this
process (cwd a fresh temporary folder, so an empty --out cannot write into the repository); the rows in
SUBPROCESS also run as `python -m flashcheck.cli`, a real process with a timeout. Fragments are matched
case-insensitively with all whitespace and rich's box characters removed (rich wraps long messages).

Run `python tests/test_bad_input.py` for a tally of the whole table (tracebacks, wrong exit codes,
messages that do not name the value, hangs), each row in its own process with a memory cap.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import struct
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROW_TIMEOUT_S = 60
HUGE = "99999999999999999999999"  # beyond int64: must be exit 2, never an OverflowError


@dataclass(frozen=True)
class Row:
    id: str
    argv: tuple[str, ...]
    code: int
    fragments: tuple[str, ...]

    @property
    def command(self) -> str:
        return self.argv[0] if self.argv else ""


def r(row_id: str, line: str, *fragments: str, code: int = 2) -> Row:
    """A row from a shell-like line ('' is an empty argument)."""
    return Row(row_id, tuple(shlex.split(line)), code, fragments)


COMPARE = [
    r("compare-numerics-empty", "compare --numerics ''", "--numerics"),
    r("compare-numerics-blank", "compare --numerics ' '", "--numerics"),
    r("compare-numerics-unknown", "compare --numerics bf17", "bf17"),
    r("compare-standard-tiles", "compare --kernel standard --block-k 16 --algorithm fa1", "--block-k and --algorithm"),
    r("compare-preset-fp8-scaling", "compare --preset sage2 --fp8-scaling block", "--fp8-scaling"),
    r("compare-numerics-bad-term", "compare --numerics bf16-mixed,p=fp99", "fp99"),
    r("compare-numerics-bad-key", "compare --numerics bf16-mixed,zz=fp32", "zz"),
    r("compare-baseline-empty", "compare --baseline-numerics ''", "--baseline-numerics"),
    r("compare-baseline-unknown", "compare --baseline-numerics nope", "nope"),
    r("compare-kernel-empty", "compare --kernel ''", "--kernel"),
    r("compare-kernel-unknown", "compare --kernel flsh", "flsh"),
    r("compare-algorithm-unknown", "compare --algorithm fa3", "fa3"),
    r("compare-block-q-zero", "compare --block-q 0", "--block-q", "0"),
    r("compare-block-q-negative", "compare --block-q -4", "--block-q", "-4"),
    r("compare-block-q-text", "compare --block-q abc", "--block-q", "abc"),
    r("compare-block-q-huge", f"compare --block-q {HUGE}", "--block-q", HUGE),
    r("compare-block-k-zero", "compare --block-k 0", "--block-k", "0"),
    r("compare-block-k-over-int32", "compare --block-k 2147483648", "--block-k", "2147483648"),
    r("compare-batch-zero", "compare --batch 0", "--batch", "0"),
    r("compare-batch-negative", "compare --batch -1", "--batch", "-1"),
    r("compare-batch-float", "compare --batch 1.5", "--batch", "1.5"),
    r("compare-batch-huge", f"compare --batch {HUGE}", HUGE),
    r("compare-heads-zero", "compare --heads 0", "--heads", "0"),
    r("compare-heads-huge", "compare --heads 1000000000000", "1000000000000"),
    r("compare-seq-len-empty", "compare --seq-len ''", "--seq-len"),
    r("compare-seq-len-zero", "compare --seq-len 0", "--seq-len", "0"),
    r("compare-seq-len-negative", "compare --seq-len -8", "--seq-len", "-8"),
    r("compare-seq-len-text", "compare --seq-len abc", "--seq-len", "abc"),
    r("compare-seq-len-float", "compare --seq-len 64.5", "--seq-len", "64.5"),
    r("compare-kv-heads-not-divisor", "compare --heads 4 --kv-heads 3", "--kv-heads 3", "--heads 4"),
    r("compare-kv-heads-zero", "compare --kv-heads 0", "--kv-heads", "0"),
    r("compare-seq-len-k-zero", "compare --seq-len-k 0", "--seq-len-k", "0"),
    r("compare-seq-len-k-1e11", "compare --seq-len-k 99999999999", "Lk=99999999999", "available", "largest seq_len_k"),
    r("compare-splits-huge", f"compare --splits {HUGE} --seq-len 1 --seq-len-k 64", f"--splits {HUGE}", "key block"),
    r("compare-splits-over-blocks", "compare --splits 128 --seq-len 1 --seq-len-k 64", "--splits 128", "from 1 to 1"),
    r("compare-padding-unknown", "compare --padding middle", "padding", "middle"),
    r(
        "compare-padding-backward",
        "compare --backend sdpa-math --padding left:0.25 --backward",
        "--padding",
        "--backward",
    ),
    r("compare-seq-len-empty-item", "compare --backend sdpa-math --seq-len 64,,128", "--seq-len", "64,,128"),
    r("compare-seq-len-list-without-backend", "compare --seq-len 64,128", "--seq-len", "64,128"),
    r("compare-seq-len-10M", "compare --seq-len 10000000", "10000000", "available", "largest seq_len"),
    r("compare-seq-len-1e11", "compare --seq-len 99999999999", "99999999999", "available"),
    r("compare-seq-len-huge", f"compare --seq-len {HUGE}", HUGE),
    r("compare-head-dim-zero", "compare --head-dim 0", "--head-dim", "0"),
    r("compare-head-dim-huge", "compare --head-dim 99999999999", "99999999999"),
    r("compare-head-dim-text", "compare --head-dim x64", "--head-dim", "x64"),
    r("compare-hadamard-head-dim-48", "compare --numerics fp64 --hadamard --head-dim 48 --seq-len 32 --heads 1", "48"),
    r("compare-preset-hadamard-head-dim-24", "compare --preset fa3-fp8 --head-dim 24", "--head-dim 24", "power-of-two"),
    r("compare-numerics-hadamard-head-dim-24", "compare --numerics fa3-fp8 --head-dim 24", "--numerics fa3-fp8", "24"),
    r("compare-distribution-empty", "compare --distribution ''", "--distribution"),
    r("compare-distribution-unknown", "compare --distribution cauchy", "cauchy"),
    r("compare-fp8-scaling-unknown", "compare --fp8-scaling row", "row"),
    r("compare-runs-zero", "compare --runs 0", "--runs", "0"),
    r("compare-runs-one", "compare --runs 1", "--runs", "1"),
    r("compare-runs-huge", f"compare --runs {HUGE}", "--runs", HUGE),
    r("compare-seed-huge", f"compare --seed {HUGE}", "--seed", HUGE),
    r("compare-seed-text", "compare --seed s0", "--seed", "s0"),
    r("compare-determinism-without-backend", "compare --determinism", "--determinism"),
    r("compare-unknown-flag", "compare --no-such-flag", "--no-such-flag"),
    r("compare-flag-without-value", "compare --heads", "--heads"),
    r("compare-kernel-choice", "compare --kernel tiled", "tiled", "flash", "standard", "splitkv"),
    r("compare-heads-text", "compare --heads eight", "--heads", "'eight' is not a valid integer"),
    r("compare-extra-argument", "compare extra", "extra"),
    r("compare-preset-empty", "compare --preset ''", "--preset"),
    r("compare-preset-unknown", "compare --preset fa9-gpu --seq-len 64 --heads 1", "fa9-gpu"),
    r("compare-device-empty", "compare --device ''", "--device"),
    r("compare-device-unknown", "compare --device tpu", "tpu"),
]

COMPARE_BACKEND = [
    r("backend-empty", "compare --backend ''", "--backend"),
    r("backend-unknown", "compare --backend sdpa-mth --seq-len 64", "sdpa-mth"),
    r("backend-trailing-comma", "compare --backend sdpa-math, --seq-len 64", "sdpa-math,"),
    r("backend-double-comma", "compare --backend sdpa-math,,eager --seq-len 64", "sdpa-math,,eager"),
    r("backend-numerics-empty", "compare --backend sdpa-math --numerics ''", "--numerics"),
    r("backend-numerics-unknown", "compare --backend sdpa-math --numerics bf17 --seq-len 64", "bf17"),
    r("backend-numerics-trailing-comma", "compare --backend sdpa-math --numerics bf16, --seq-len 64", "bf16,"),
    r("backend-seq-len-zero", "compare --backend sdpa-math --seq-len 0", "--seq-len", "0"),
    r("backend-seq-len-list-negative", "compare --backend sdpa-math --seq-len 64,-1", "64,-1"),
    r("backend-seq-len-list-text", "compare --backend sdpa-math --seq-len 64,x", "64,x"),
    r("backend-seq-len-10M", "compare --backend sdpa-math --seq-len 10000000", "10000000", "largest seq_len"),
    r("backend-seq-len-list-huge", "compare --backend sdpa-math --seq-len 64,99999999999", "99999999999"),
    r("backend-batch-huge", f"compare --backend sdpa-flash --batch {HUGE}", HUGE),
    r("backend-heads-zero", "compare --backend sdpa-math --heads 0", "--heads", "0"),
    r("backend-head-dim-huge", "compare --backend sdpa-math --head-dim 99999999999", "99999999999"),
    r("backend-runs-huge", f"compare --backend sdpa-math --determinism --runs {HUGE}", "--runs", HUGE),
    r("backend-runs-one", "compare --backend sdpa-math --determinism --runs 1", "--runs", "1"),
    r("backend-seed-huge-negative", f"compare --backend sdpa-math --seed -{HUGE}", "--seed", HUGE),
    r("backend-preset-unknown", "compare --backend sim-flash --preset nope --seq-len 64", "nope"),
    r("backend-preset-empty", "compare --backend sim-flash --preset ''", "--preset"),
    r("backend-baseline-unknown", "compare --backend sdpa-math --baseline-numerics nope --seq-len 32", "nope"),
    r("backend-device-unknown", "compare --backend sdpa-math --device tpu", "tpu"),
    r("backend-block-k-huge", f"compare --backend sim-flash --block-k {HUGE}", "--block-k", HUGE),
]

EXPLAIN = [
    r("explain-numerics-empty", "explain --numerics ''", "--numerics"),
    r("explain-numerics-unknown", "explain --numerics bf17", "bf17"),
    r("explain-preset-empty", "explain --preset ''", "--preset"),
    r("explain-preset-unknown", "explain --preset fa9", "fa9"),
    r("explain-preset-format-unknown", "explain --preset fa2-gpu --numerics fp77", "fp77"),
    r("explain-kernel-unknown", "explain --kernel tiled", "tiled"),
    r("explain-algorithm-unknown", "explain --algorithm fa0", "fa0"),
    r("explain-block-q-zero", "explain --block-q 0", "--block-q", "0"),
    r("explain-block-q-huge", f"explain --block-q {HUGE}", "--block-q", HUGE),
    r("explain-block-k-text", "explain --block-k big", "--block-k", "big"),
    r("explain-batch-zero", "explain --batch 0", "--batch", "0"),
    r("explain-batch-huge", f"explain --batch {HUGE}", HUGE),
    r("explain-heads-negative", "explain --heads -2", "--heads", "-2"),
    r("explain-seq-len-zero", "explain --seq-len 0", "--seq-len", "0"),
    r("explain-seq-len-10M", "explain --seq-len 10000000", "10000000", "largest seq_len"),
    r("explain-seq-len-huge", f"explain --seq-len {HUGE}", HUGE),
    r("explain-head-dim-zero", "explain --head-dim 0", "--head-dim", "0"),
    r("explain-head-dim-huge", "explain --head-dim 99999999999", "99999999999"),
    r("explain-distribution-unknown", "explain --distribution cauchy", "cauchy"),
    r("explain-metric-empty", "explain --metric ''", "--metric"),
    r("explain-metric-unknown", "explain --metric l3", "l3"),
    r("explain-seed-huge", f"explain --seed {HUGE}", "--seed", HUGE),
    r("explain-out-empty", "explain --out ''", "--out"),
    r("explain-out-is-a-file", "explain --out {file} --seq-len 32 --heads 1", "{file}"),
    r("explain-out-under-a-file", "explain --out {file}/sub --seq-len 32 --heads 1", "{file}"),
    r("explain-out-missing-parent", "explain --out {missing}/sub --seq-len 32 --heads 1", "{missing}", "not exist"),
    r("explain-hadamard-head-dim-48", "explain --numerics fp64,hadamard=true --head-dim 48 --seq-len 32", "48"),
    r("explain-unknown-flag", "explain --no-such-flag", "--no-such-flag"),
    r("explain-extra-argument", "explain extra", "extra"),
]

BACKENDS = [
    r("backends-extra-argument", "backends extra", "extra"),
    r("backends-unknown-flag", "backends --no-such-flag", "--no-such-flag"),
    r("backends-device-empty", "backends --device ''", "--device"),
    r("backends-device-unknown", "backends --device tpu", "tpu"),
    r("backends-json-value", "backends --json yes", "yes"),
]

DOCTOR = [
    r("doctor-seq-len-zero", "doctor --seq-len 0", "--seq-len", "0"),
    r("doctor-seq-len-negative", "doctor --seq-len -1", "--seq-len", "-1"),
    r("doctor-seq-len-text", "doctor --seq-len long", "--seq-len", "long"),
    r("doctor-seq-len-10M", "doctor --seq-len 10000000", "10000000", "largest seq_len"),
    r("doctor-seq-len-huge", f"doctor --seq-len {HUGE}", HUGE),
    r("doctor-head-dim-zero", "doctor --head-dim 0", "--head-dim", "0"),
    r("doctor-head-dim-huge", "doctor --head-dim 99999999999", "99999999999"),
    r("doctor-dtype-empty", "doctor --dtype ''", "--dtype"),
    r("doctor-dtype-fp64", "doctor --dtype fp64", "fp64"),
    r("doctor-dtype-int8", "doctor --dtype int8", "int8"),
    r("doctor-dtype-list", "doctor --dtype bf16,fp16", "bf16,fp16"),
    r("doctor-dtype-unknown", "doctor --dtype fp7", "'fp7'", "expected one of fp32, bf16, fp16\n"),  # only those
    r("doctor-dtype-fp8", "doctor --dtype fp8-e4m3", "'fp8-e4m3'", "expected one of fp32, bf16, fp16\n"),
    r("doctor-unknown-flag", "doctor --no-such-flag", "--no-such-flag"),
    r("doctor-extra-argument", "doctor extra", "extra"),
]

STUDY = [
    r("study-preset-empty", "study --preset ''", "--preset"),
    r("study-preset-unknown", "study --preset enormous", "enormous"),
    r("study-config-empty", "study --config ''", "--config"),
    r("study-config-missing", "study --config {missing}", "{missing}"),
    r("study-config-directory", "study --config {dir}", "{dir}"),
    r("study-config-not-utf8", "study --config {toml_not_utf8}", "{toml_not_utf8}"),
    r("study-config-corrupt", "study --config {toml_corrupt}", "{toml_corrupt}"),
    r("study-config-baseline-no", "study --config {toml_baseline_no}", "baseline", "no"),
    r("study-config-causal-yes", "study --config {toml_causal_yes}", "causal", "yes"),
    r("study-config-seq-lens-true", "study --config {toml_seq_lens_true}", "seq_lens"),
    r("study-config-fp8-head-dim-48", "study --config {toml_fp8_48}", "48"),
    r("study-config-unknown-field", "study --config {toml_unknown_field}", "foo"),
    r("study-config-empty-file", "study --config {toml_empty}", "sweeps"),
    r("study-config-unknown-method", "study --config {toml_bad_method}", "warp:bf16"),
    r("study-config-seq-len-zero", "study --config {toml_seq_zero}", "seq_lens"),
    r("study-config-heads-float", "study --config {toml_heads_float}", "heads", "2.5"),
    r("study-config-blocks-bad", "study --config {toml_blocks_bad}", "blocks"),
    r("study-config-distribution-unknown", "study --config {toml_dist_bad}", "cauchy"),
    r("study-config-metric-unknown", "study --config {toml_metric_bad}", "l3"),
    r("study-config-seeds-negative", "study --config {toml_seeds_neg}", "seeds"),
    r("study-config-methods-empty", "study --config {toml_methods_empty}", "methods"),
    r("study-config-question-empty", "study --config {toml_question_empty}", "question"),
    r("study-config-sweeps-not-a-list", "study --config {toml_sweeps_int}", "sweeps"),
    r("study-out-empty", "study --preset tiny --out ''", "--out"),
    r("study-out-is-a-file", "study --preset tiny --out {file}", "{file}"),
    r("study-out-under-a-file", "study --preset tiny --out {file}/sub", "{file}"),
    r("study-out-missing-parent", "study --preset tiny --out {missing}/sub", "{missing}", "not exist"),
    r("study-workers-zero", "study --preset tiny --workers 0", "--workers", "0"),
    r("study-workers-negative", "study --preset tiny --workers -2", "--workers", "-2"),
    r("study-workers-huge", f"study --preset tiny --workers {HUGE}", "--workers", HUGE),
    r("study-workers-text", "study --preset tiny --workers many", "--workers", "many"),
    r("study-executor-unknown", "study --executor dask", "dask"),
    r("study-executor-empty", "study --executor ''", "--executor"),
    r("study-ray-address-empty", "study --preset tiny --executor ray --ray-address ''", "--ray-address"),
    r("study-ray-unreachable", "study --preset tiny --executor ray --ray-address 127.0.0.1:1", "127.0.0.1:1"),
    r("study-unknown-flag", "study --no-such-flag", "--no-such-flag"),
    r("study-extra-argument", "study extra", "extra"),
]

REPORT = [
    r("report-empty", "report ''", "''"),
    r("report-missing", "report {missing}", "{missing}", "does not exist"),
    r("report-a-file", "report {file}", "{file}", "not a folder"),
    r("report-serving-unit-a-link", "report {serving_link}", "vllm54035-fp8.json", "symbolic link"),
    r("report-serving-unit-bad-field", "report {serving_bad}", "vllm54035-fp8.json", "'holds'", "true or false"),
    r("report-serving-unit-unknown", "report {serving_unknown}", "'nosuch'", "not a unit the serving study writes"),
    r("study-serving-unit-bad-field", "study --preset serving-tiny --out {serving_bad} --quiet", "'holds'"),
    r("report-empty-folder", "report {dir}", "{dir}"),
    r("report-study-json-is-a-directory", "report {study_json_dir}", "study.json"),
    r("report-records-is-a-directory", "report {records_dir}", "records.jsonl"),
    r("report-no-argument", "report", "FOLDER"),
    r("report-two-arguments", "report {dir} other", "other"),
    r("report-unknown-flag", "report {dir} --no-such-flag", "--no-such-flag"),
]

TRAIN_STUDY = [
    r("train-study-preset-empty", "train-study --preset ''", "--preset"),
    r("train-study-preset-unknown", "train-study --preset enormous", "enormous"),
    r("train-study-out-empty", "train-study --preset tiny --out ''", "--out"),
    r("train-study-out-is-a-file", "train-study --preset tiny --out {file}", "{file}"),
    r("train-study-out-missing-parent", "train-study --preset tiny --out {missing}/a/b", "{missing}", "not exist"),
    r("train-study-tied-max-steps-zero", "train-study --preset tied-max --steps 0", "--steps 0"),
    r("train-study-tied-max-seeds-zero", "train-study --preset tied-max --seeds 0", "--seeds 0"),
    r("train-study-steps-huge", "train-study --preset tiny --steps 99999999999", "--steps 99999999999"),
    r(
        "train-study-save-every-past-steps",
        "train-study --preset tiny --steps 3 --save-every 5",
        "--save-every 5",
        "(3)",
    ),
    r("train-study-seeds-huge", "train-study --preset tiny --seeds 1000", "--seeds 1000"),
    r("train-study-preset-unknown-listed", "train-study --preset huge", "'huge'", "quick, paper, full, tied-max"),
    r("train-study-tied-max-out-missing-parent", "train-study --preset tied-max --out {missing}/a", "{missing}"),
    r("train-study-workers-zero", "train-study --preset tiny --workers 0", "--workers", "0"),
    r("train-study-workers-huge", f"train-study --preset tiny --workers {HUGE}", "--workers", HUGE),
    r("train-study-workers-text", "train-study --workers two", "--workers", "two"),
    r("train-study-tied-max-out-empty", "train-study --preset tied-max --out ''", "--out"),
    r("train-study-extra-argument", "train-study extra", "extra"),
]

DRIFT = [
    r("drift-missing", "drift {missing} {st_ok}", "{missing}"),
    r("drift-a-empty", "drift '' {st_ok}", "''"),
    r("drift-b-empty", "drift {st_ok} ''", "''"),
    r("drift-not-safetensors", "drift {st_garbage} {st_ok}", "{st_garbage}"),
    r("drift-header-a-list", "drift {st_header_list} {st_ok}", "{st_header_list}"),
    r("drift-header-entry-not-a-table", "drift {st_entry_int} {st_ok}", "{st_entry_int}"),
    r("drift-no-data-offsets", "drift {st_no_offsets} {st_ok}", "{st_no_offsets}", "w"),
    r("drift-reversed-offsets", "drift {st_reversed} {st_ok}", "{st_reversed}", "w"),
    r("drift-shape-disagrees-with-bytes", "drift {st_shape_mismatch} {st_ok}", "{st_shape_mismatch}", "w"),
    r("drift-unknown-dtype", "drift {st_bad_dtype} {st_ok}", "{st_bad_dtype}", "w"),
    r("drift-truncated", "drift {st_truncated} {st_ok}", "{st_truncated}"),
    r("drift-header-length-huge", "drift {st_header_huge} {st_ok}", "{st_header_huge}"),
    r("drift-header-not-utf8", "drift {st_header_not_utf8} {st_ok}", "{st_header_not_utf8}"),
    r("drift-offsets-text", "drift {st_offsets_text} {st_ok}", "{st_offsets_text}"),
    r("drift-shape-negative", "drift {st_shape_negative} {st_ok}", "{st_shape_negative}"),
    r("drift-torch-garbage", "drift {pt_garbage} {st_ok}", "{pt_garbage}"),
    r("drift-empty-folders", "drift {dir} {dir}", "{dir}"),
    r("drift-sketch-points-zero", "drift {st_ok} {st_ok} --sketch-points 0", "--sketch-points", "0"),
    r("drift-sketch-points-huge", f"drift {{st_ok}} {{st_ok}} --sketch-points {HUGE}", "--sketch-points", HUGE),
    r("drift-exact-limit-negative", "drift {st_ok} {st_ok} --exact-limit -5", "--exact-limit", "-5"),
    r("drift-exact-limit-text", "drift {st_ok} {st_ok} --exact-limit lots", "--exact-limit", "lots"),
    r("drift-one-argument", "drift {st_ok}", "B"),
    r("drift-no-tensor-in-common", "drift {st_ok} {st_w3}", "no tensor in common", "w is (2,) in A, (3,) in B"),
    r("drift-sketch-points-float", "drift {st_ok} {st_ok} --sketch-points 2.5", "--sketch-points", "2.5"),
]

MUTANTS = [  # run only once `flashcheck mutants` exists
    r("mutants-rule-empty", "mutants --rule ''", "--rule"),
    r("mutants-rule-unknown", "mutants --rule strict", "strict"),
    r("mutants-rule-trailing-comma", "mutants --rule peers,", "peers,"),
    r("mutants-size-empty", "mutants --size ''", "--size"),
    r("mutants-size-unknown", "mutants --size enormous", "enormous"),
    r("mutants-out-empty", "mutants --size tiny --out ''", "--out"),
    r("mutants-out-is-a-file", "mutants --size tiny --out {file}", "{file}"),
    r("mutants-out-missing-parent", "mutants --size tiny --out {missing}/sub", "{missing}", "not exist"),
    r("mutants-extra-argument", "mutants extra", "extra"),
]

PREDICT = [
    r("predict-seq-len-missing", "predict --numerics bf16", "--seq-len"),
    r("predict-splits-without-splitkv", "predict --seq-len 64 --splits 4", "--splits 4", "only for --kernel splitkv"),
    r("predict-numerics-unknown", "predict --numerics bf17 --seq-len 8", "bf17"),
    r("predict-seq-len-zero", "predict --numerics bf16 --seq-len 0", "--seq-len", "0"),
    r("predict-seq-len-text", "predict --numerics bf16 --seq-len lots", "--seq-len", "lots"),
    r("predict-seq-len-k-negative", "predict --numerics bf16 --seq-len 8 --seq-len-k -1", "--seq-len-k", "-1"),
    r("predict-block-k-zero", "predict --numerics bf16 --seq-len 8 --block-k 0", "--block-k", "0"),
    r("predict-kernel-unknown", "predict --numerics bf16 --seq-len 8 --kernel fancy", "fancy"),
    r("predict-distribution-unknown", "predict --numerics bf16 --seq-len 8 --distribution zipf", "zipf"),
    r("predict-draw-distribution-unknown", "predict --numerics bf16 --seq-len 8 --draw --distribution zipf", "zipf"),
    r("predict-splits-zero", "predict --numerics bf16 --seq-len 8 --kernel splitkv --splits 0", "--splits", "0"),
    r("predict-seq-len-huge", f"predict --numerics bf16 --seq-len {HUGE}", HUGE, "error model covers 1 to 16777216"),
    r("predict-draw-too-big", "predict --numerics bf16 --seq-len 2000000 --draw", "--draw", "leave out --draw"),
    r("predict-seq-len-k-huge", f"predict --numerics bf16 --seq-len 1 --seq-len-k {HUGE}", HUGE, "error model covers"),
    r(
        "predict-head-dim-huge",
        f"predict --numerics bf16 --seq-len 8 --head-dim {HUGE}",
        HUGE,
        "error model covers 1 to 1024",
    ),
    r(
        "predict-splits-over-blocks",
        f"predict --numerics bf16 --seq-len 1024 --kernel splitkv --splits {HUGE}",
        f"--splits {HUGE}",
        "from 1 to 8",
    ),
    r(
        "predict-fp8-head-dim-48",
        "predict --numerics fa3-fp8 --head-dim 48 --seq-len 64",
        "head_dim=48",
        "power-of-two",
    ),
    r("predict-numerics-empty", "predict --numerics '' --seq-len 8", "--numerics", "empty"),
    r("predict-heads-zero", "predict --seq-len 8 --heads 0", "--heads 0", ">= 1"),
    r("predict-kv-heads-not-divisor", "predict --seq-len 8 --heads 4 --kv-heads 3", "--kv-heads 3", "divisor"),
    r("predict-seed-huge", "predict --seq-len 8 --seed 99999999999999999999", "--seed", "9223372036854775807"),
    r("predict-scale-overflow", "predict --seq-len 8 --scale 1e30", "--scale", "overflow", "largest scale"),
    r("predict-scale-overflow-fp16", "predict --numerics fp16-mixed --seq-len 8 --scale 1e6", "fp16", "largest scale"),
]

VALIDATE = [  # run only once `flashcheck validate` exists
    r("validate-unknown-flag", "validate --no-such-flag", "--no-such-flag"),
    r("validate-model-empty", "validate --model ''", "--model"),
    r("validate-out-empty", "validate --out ''", "--out"),
    r("validate-out-missing-parent", "validate --out {missing}/sub", "{missing}", "not exist"),
    r("validate-out-is-a-file", "validate --out {file}", "{file}"),
    r("validate-samples-zero", "validate --samples 0", "--samples 0"),
    r("validate-batch-size-zero", "validate --batch-size 0", "--batch-size 0"),
    r("validate-samples-text", "validate --samples many", "--samples", "many"),
]

CONSISTENCY = [
    r("consistency-no-target", "consistency", "TARGET"),
    r("consistency-unknown-backend", "consistency sdpa-nope", "'sdpa-nope'", "sim-flashinfer-fixed"),
    r("consistency-bad-check", "consistency sdpa-math --checks nope", "'nope'", "determinism"),
    r("consistency-empty-check", "consistency sdpa-math --checks 'batch,'", "--checks", "empty item"),
    r("consistency-kv-bad", "consistency sim-fa3 --kv fp3", "'fp3'", "fp8"),
    r("consistency-kv-scale-bad", "consistency sim-fa3 --kv fp8/dyn", "'dyn'", "static"),
    r("consistency-dtype-bad", "consistency sdpa-math --dtype fp7", "'fp7'", "bf16"),
    r("consistency-max-batch-zero", "consistency sdpa-math --max-batch 0", "--max-batch", "1 to 64"),
    r("consistency-kv-len-huge", f"consistency sdpa-math --kv-len {HUGE}", "--kv-len"),
    r("consistency-kv-heads", "consistency sdpa-math --heads 4 --kv-heads 3", "--kv-heads 3"),
    r("consistency-callable-missing", "consistency nomodule_xyz:fn", "'nomodule_xyz:fn'", "module:function"),
    r("consistency-out-is-a-file", "consistency sdpa-math --out {file}", "{file}"),
    r("validate-kv-cache-bad", "validate {dir} --kv-cache fp3", "'fp3'", "fp8"),
    r("validate-kv-cache-bad-no-model", "validate --kv-cache fp9", "--kv-cache 'fp9'", "fp8"),
    r("validate-kv-cache-bad-missing-model", "validate {missing} --kv-cache fp9", "--kv-cache 'fp9'"),
    r("validate-model-missing", "validate {missing}", "{missing}", "does not exist"),
    r("validate-check-pin-not-json", "validate --check-pin {file}", "{file}' (pin file) is not JSON (Expecting"),
    r("validate-kv-new-tokens-zero", "validate {dir} --kv-cache fp8 --new-tokens 0", "--new-tokens 0"),
]

JUDGE = [
    r("judge-no-file", "judge", "FILE"),
    r("judge-empty", "judge ''", "FILE", "empty"),
    r("judge-missing", "judge {missing}", "{missing}", "is not a file"),
    r("judge-dir", "judge {dir}", "{dir}", "is not a file"),
    r("judge-text-file", "judge {file}", ".txt", "expected .safetensors or .npz"),
    r("judge-pickle", "judge {pt_garbage}", ".pt", "expected .safetensors or .npz"),
    r("judge-garbage", "judge {st_garbage}", "is not a valid safetensors file: 5 bytes, shorter than the 8-byte"),
    r("judge-header-huge", "judge {st_header_huge}", "header length"),
    r("judge-header-list", "judge {st_header_list}", "not a JSON object"),
    r("judge-header-not-utf8", "judge {st_header_not_utf8}", "is not a valid safetensors file: the header is not JSON"),
    r("judge-entry-int", "judge {st_entry_int}", "'w'", "dtype, shape and data_offsets"),
    r("judge-reversed", "judge {st_reversed}", "'w'", "[8, 0]"),
    r("judge-shape-mismatch", "judge {st_shape_mismatch}", "'w'", "[3, 3]"),
    r("judge-bad-dtype", "judge {st_bad_dtype}", "'w'", "F128", "BF16"),
    r("judge-truncated", "judge {st_truncated}", "'w'", "[0, 800]"),
    r("judge-offsets-text", "judge {st_offsets_text}", "'w'", "data_offsets"),
    r("judge-shape-negative", "judge {st_shape_negative}", "'w'", "[-1]"),
    r("judge-unknown-tensor", "judge {st_ok}", "unknown name(s) 'w'", "q, k, v, out"),
    r("judge-unknown-flag", "judge {st_ok} --no-such-flag", "--no-such-flag"),
]

HUNT = [
    r("hunt-target-unknown", "hunt nosuch", "'nosuch'", "sdpa-math"),
    r("hunt-target-empty", "hunt ''", "unknown target ''"),
    r("hunt-callable-missing", "hunt nomod:fn", "'nomod:fn'", "nomod"),
    r("hunt-format-unknown", "hunt sdpa-math:fp99", "'fp99'", "bf16"),
    r("hunt-budget-zero", "hunt sdpa-math --budget 0s", "--budget", "'0s'"),
    r("hunt-budget-text", "hunt sdpa-math --budget xyz", "'xyz'", "5m"),
    r("hunt-rounds-negative", "hunt sdpa-math --rounds -1", "--rounds", "-1"),
    r("hunt-case-timeout-zero", "hunt sdpa-math --case-timeout 0", "--case-timeout", "'0'"),
    r("hunt-case-timeout-text", "hunt sdpa-math --case-timeout soon", "--case-timeout", "'soon'", "90s"),
    r("hunt-fp8-preset-format", "hunt fa3-fp8:fp16", "'fa3-fp8:fp16'", "fp8-e4m3"),
    r("hunt-callable-format-unknown", "hunt mod:fn:fp9", "'fp9'", "fp8-e4m3"),
]

SEED_RULE = "--seed must be an integer from 0 to 9223372036854775807"  # one rule, one validator (cli.app._seed)
SEEDS = [  # every command's --seed (test_every_seed_option_has_a_row), each refusing -1 with the same words
    r("seed-negative-compare", "compare --seed -1", "-1", SEED_RULE),
    r("seed-negative-explain", "explain --seed -1", "-1", SEED_RULE),
    r("seed-negative-predict", "predict --seq-len 8 --seed -1", "-1", SEED_RULE),
    r("seed-negative-hunt", "hunt sdpa-math --seed -1", "-1", SEED_RULE),
    r("seed-huge-hunt", "hunt sdpa-math --seed 9223372036854775808", "9223372036854775808", SEED_RULE),
]

ROWS = [
    *SEEDS,
    *COMPARE,
    *CONSISTENCY,
    *JUDGE,
    *COMPARE_BACKEND,
    *EXPLAIN,
    *BACKENDS,
    *DOCTOR,
    *STUDY,
    *REPORT,
    *TRAIN_STUDY,
    *DRIFT,
    *MUTANTS,
    *PREDICT,
    *VALIDATE,
    *HUNT,
]
SUBPROCESS = {  # a few as real processes (each pays torch's import, several seconds)
    "compare-seq-len-10M",
    "doctor-seq-len-huge",
    "study-ray-unreachable",
    "report-records-is-a-directory",
    "drift-header-a-list",
}


# --- fixtures: the files the rows name ----------------------------------------------------------

SWEEP = 'question = "q"\nmethods = ["flash:bf16"]\nseq_lens = [32]\nheads = 1\n'
TOMLS = {
    "toml_corrupt": "name = \n[[sweeps",
    "toml_baseline_no": f'[[sweeps]]\n{SWEEP}baseline = "no"\n',
    "toml_causal_yes": f'[[sweeps]]\n{SWEEP}causal = "yes"\n',
    "toml_seq_lens_true": '[[sweeps]]\nquestion = "q"\nmethods = ["flash:bf16"]\nseq_lens = [true]\n',
    "toml_fp8_48": '[[sweeps]]\nquestion = "q"\nmethods = ["flash:fa3-fp8"]\nhead_dims = [48]\nseq_lens = [32]\n',
    "toml_unknown_field": f"[[sweeps]]\n{SWEEP}foo = 1\n",
    "toml_empty": "",
    "toml_bad_method": '[[sweeps]]\nquestion = "q"\nmethods = ["warp:bf16"]\n',
    "toml_seq_zero": '[[sweeps]]\nquestion = "q"\nmethods = ["flash:bf16"]\nseq_lens = [0]\n',
    "toml_heads_float": '[[sweeps]]\nquestion = "q"\nmethods = ["flash:bf16"]\nheads = 2.5\n',
    "toml_blocks_bad": f"[[sweeps]]\n{SWEEP}blocks = [[16]]\n",
    "toml_dist_bad": f'[[sweeps]]\n{SWEEP}distributions = ["cauchy"]\n',
    "toml_metric_bad": f'[[sweeps]]\n{SWEEP}metric = "l3"\n',
    "toml_seeds_neg": f"[[sweeps]]\n{SWEEP}seeds = [-1]\n",
    "toml_methods_empty": '[[sweeps]]\nquestion = "q"\nmethods = []\n',
    "toml_question_empty": '[[sweeps]]\nquestion = ""\nmethods = ["flash:bf16"]\n',
    "toml_sweeps_int": "sweeps = 1\n",
}


def _safetensors(header: object, data: bytes = b"\0" * 8, *, raw_header: bytes | None = None) -> bytes:
    head = raw_header if raw_header is not None else json.dumps(header).encode()
    return struct.pack("<Q", len(head)) + head + data


def _tensor(**changes: object) -> dict:
    return {"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8], **changes}}


SAFETENSORS = {
    "st_ok": _safetensors(_tensor()),
    "st_header_list": _safetensors([1, 2]),
    "st_entry_int": _safetensors({"w": 5}),
    "st_no_offsets": _safetensors({"w": {"dtype": "F32", "shape": [2]}}),
    "st_reversed": _safetensors(_tensor(data_offsets=[8, 0])),
    "st_shape_mismatch": _safetensors(_tensor(shape=[3, 3])),
    "st_bad_dtype": _safetensors(_tensor(dtype="F128")),
    "st_truncated": _safetensors(_tensor(data_offsets=[0, 800])),
    "st_header_not_utf8": _safetensors(None, raw_header=b'{"w\xff\xfe": 1}'),
    "st_offsets_text": _safetensors(_tensor(data_offsets=["a", "b"])),
    "st_shape_negative": _safetensors(_tensor(shape=[-1])),
    "st_w3": _safetensors(_tensor(shape=[3], data_offsets=[0, 12]), b"\0" * 12),
}


def make_files(root: Path) -> dict[str, Path]:
    """Every file the rows name, under root."""
    files: dict[str, Path] = {"missing": root / "no-such-file", "dir": root / "a-folder", "file": root / "a-file.txt"}
    files["dir"].mkdir()
    files["file"].write_text("not a folder\n")
    for name, text in TOMLS.items():
        files[name] = root / f"{name}.toml"
        files[name].write_text(text)
    files["toml_not_utf8"] = root / "toml_not_utf8.toml"
    files["toml_not_utf8"].write_bytes(b'name = "\xff\xfe"\n')
    for name, blob in SAFETENSORS.items():
        files[name] = root / f"{name}.safetensors"
        files[name].write_bytes(blob)
    files["st_garbage"] = root / "st_garbage.safetensors"
    files["st_garbage"].write_bytes(b"hello")
    files["st_header_huge"] = root / "st_header_huge.safetensors"
    files["st_header_huge"].write_bytes(struct.pack("<Q", 2**62) + b"{}")
    files["pt_garbage"] = root / "pt_garbage.pt"
    files["pt_garbage"].write_bytes(b"\x80\x02not a pickle")
    for name, inner in (("study_json_dir", "study.json"), ("records_dir", "records.jsonl")):
        files[name] = root / name
        (files[name] / inner).mkdir(parents=True)
        if inner == "records.jsonl":
            sweep = {"question": "q", "methods": ["flash:bf16"], "seq_lens": [32], "heads": 1}
            (files[name] / "study.json").write_text(json.dumps({"name": "x", "sweeps": [sweep]}))
    _serving_folders(root, files)
    return files


def _serving_folders(root: Path, files: dict[str, Path]) -> None:
    """Serving study folders whose stored unit is a link, lacks a field, or is not a unit the study writes."""
    unit = {"check": "prefill-decode", "target": "sim-fa3", "holds": False, "unit": "KV length", "first": 97,
            "max_abs": 0.01, "compared": 10}  # fmt: skip
    for name, stem, data in (("serving_link", "vllm54035-fp8", unit), ("serving_bad", "vllm54035-fp8",
                             {**unit, "holds": "no"}), ("serving_unknown", "nosuch", unit)):  # fmt: skip
        files[name] = root / name
        (files[name] / "serving").mkdir(parents=True)
        (files[name] / "serving.json").write_text("{}")
        target = files[name] / "serving" / f"{stem}.json"
        if name == "serving_link":
            (root / "elsewhere.json").write_text(json.dumps(unit))
            target.symlink_to(root / "elsewhere.json")
        else:
            target.write_text(json.dumps(data))


def expand(row: Row, files: dict[str, Path]) -> tuple[list[str], list[str]]:
    """The row's argv with {name} replaced by paths, and its fragments with {name} replaced by base names."""
    paths = {k: str(v) for k, v in files.items()}
    names = {k: v.name for k, v in files.items()}
    return [a.format(**paths) for a in row.argv], [f.format(**names) for f in row.fragments]


def _squash(text: str) -> str:
    return re.sub(r"[\s│╭╮╰╯─┃━]+", "", text).lower()


def problems(row: Row, code: int, output: str, exception: BaseException | None, fragments: list[str]) -> list[str]:
    """What is wrong with one run: TRACEBACK, EXIT (wrong code), MESSAGE (a fragment missing), LINES (a usage
    error over more than one line: rich's framed box, usage lines, a log)."""
    out = []
    if "Traceback" in output or (exception is not None and not isinstance(exception, SystemExit)):
        out.append(f"TRACEBACK {type(exception).__name__ if exception else ''}".strip())
    if code != row.code:
        out.append(f"EXIT {code} (expected {row.code})")
    missing = [f for f in fragments if _squash(f) not in _squash(output)]
    if missing:
        out.append(f"MESSAGE without {missing}")
    if code == 2 and len(output.strip().splitlines()) != 1:
        out.append(f"LINES {len(output.strip().splitlines())} (a usage error is one line)")
    return out


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    return make_files(tmp_path_factory.mktemp("bad-input"))


def _registered() -> set[str]:
    import typer.main

    from flashcheck.cli import app

    return set(typer.main.get_command(app).commands)


def _skip_unless_registered(row: Row) -> None:
    if row.command not in _registered():
        pytest.skip(f"`flashcheck {row.command}` does not exist yet")


@pytest.mark.timeout(ROW_TIMEOUT_S)
@pytest.mark.parametrize("row", ROWS, ids=[row.id for row in ROWS])
def test_bad_input_in_process(row: Row, files, tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from flashcheck.cli import app

    _skip_unless_registered(row)
    monkeypatch.chdir(tmp_path)
    argv, fragments = expand(row, files)
    result = CliRunner().invoke(app, argv, catch_exceptions=True)
    output = result.output  # stdout and stderr, as a person sees them
    found = problems(row, result.exit_code, output, result.exception, fragments)
    assert not found, f"{row.id}: {found}\n{output[-1500:]}"


@pytest.fixture(scope="module")
def real_process(tmp_path_factory) -> Iterator[Callable[[list[str]], tuple[int | None, str]]]:
    """run(argv) -> (exit code, or None for a hang, and stdout + stderr) of `python -m flashcheck.cli argv` as a
    real process in a fresh folder, forked from one interpreter per module and worker that imported the CLI and
    torch once (helpers.forked_runs: flashcheck.cli imports torch lazily, so each row paid it again)."""
    from helpers import forked_runs

    with forked_runs(["torch", "flashcheck.cli"], ROW_TIMEOUT_S, env={**os.environ, "COLUMNS": "200"}) as forked:

        def run(argv: list[str]) -> tuple[int | None, str]:
            cwd = tmp_path_factory.mktemp("real-process")
            log = cwd.parent / f"{cwd.name}.log"
            return forked("module", "flashcheck.cli", ["flashcheck", *argv], str(cwd), log)

        yield run


@pytest.mark.parametrize("row", [row for row in ROWS if row.id in SUBPROCESS], ids=lambda row: row.id)
def test_bad_input_in_a_real_process(row: Row, files, real_process):
    _skip_unless_registered(row)
    argv, fragments = expand(row, files)
    code, output = real_process(argv)
    assert code is not None, f"{row.id}: HANG (no exit within {ROW_TIMEOUT_S} s)"
    found = problems(row, code, output, None, fragments)
    assert not found, f"{row.id}: {found}\n{output[-1500:]}"
    assert len(output.strip().splitlines()) <= 12, "a usage error is a short message, not a log"


def test_the_table_covers_every_command():
    """At least 150 rows, and rows for every command the CLI registers (a new command needs rows)."""
    assert len(ROWS) >= 150
    assert len({row.id for row in ROWS}) == len(ROWS), "row ids must be unique"
    assert _registered() <= {row.command for row in ROWS}


def test_every_seed_option_has_a_row():
    """The commands that take --seed are those of SEEDS (a new --seed must use cli.app._seed and get a row)."""
    import typer.main

    from flashcheck.cli import app

    group = typer.main.get_command(app)
    seeded = {n for n, c in group.commands.items() if any("--seed" in p.opts for p in c.params)}
    assert seeded == {row.argv[0] for row in SEEDS}


# --- real processes, and the tally of the whole table ----------------------------------------------


def run_process(argv: list[str], cwd: Path, memory_bytes: int | None = None) -> tuple[int | None, str]:
    """(exit code, or None when it ran past ROW_TIMEOUT_S, and stdout + stderr) of `flashcheck argv` in
    its own process group, with RLIMIT_DATA = memory_bytes when given."""
    import resource

    def cap() -> None:
        if memory_bytes is not None:
            resource.setrlimit(resource.RLIMIT_DATA, (memory_bytes, memory_bytes))

    proc = subprocess.Popen(
        [sys.executable, "-m", "flashcheck.cli", *argv],
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        preexec_fn=cap,
        start_new_session=True,  # so that a hang's worker processes are ended with it
        env={**os.environ, "COLUMNS": "200"},
    )
    try:
        output, _ = proc.communicate(timeout=ROW_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        return None, ""
    return proc.returncode, output


def tally(memory_gib: float = 6.0) -> dict[str, list[str]]:
    """Every row as a real process: {kind: [row ids]} for TRACEBACK, EXIT, MESSAGE, LINES, HANG and ok."""
    import tempfile

    kinds: dict[str, list[str]] = {k: [] for k in ("ok", "TRACEBACK", "EXIT", "MESSAGE", "LINES", "HANG", "skipped")}
    registered = _registered()
    with tempfile.TemporaryDirectory() as tmp:
        files = make_files(Path(tmp))
        for i, row in enumerate(ROWS):
            if row.command not in registered:
                kinds["skipped"].append(row.id)
                continue
            argv, fragments = expand(row, files)
            cwd = Path(tmp) / f"cwd-{i}"
            cwd.mkdir()
            code, output = run_process(argv, cwd, int(memory_gib * 2**30))
            found = ["HANG"] if code is None else problems(row, code, output, None, fragments)
            for kind in {p.split()[0] for p in found} or {"ok"}:
                kinds[kind].append(row.id)
            last = output.strip().splitlines()[-1][:160] if output.strip() else ""
            print(f"{row.id:45s} {'ok' if not found else '; '.join(found)[:60]:60s} | {last}", flush=True)
    return kinds


if __name__ == "__main__":
    result = tally()
    print(json.dumps({k: len(v) for k, v in result.items()}), file=sys.stderr)
    print(json.dumps(result, indent=1))
