#!/usr/bin/env bash
# The GPU checks of the real backends, in one call on a machine with a CUDA GPU (about 5 minutes; most of it
# is FlexAttention's torch.compile). Run from the repository root:
#     bash benchmarks/gpu_check.sh            # results in $OUT, or ./gpu-check-out without it
# 1. the environment (torch, CUDA, GPU; which optional packages import);
# 2. the op names a CUDA run of each backend records (all of them, unfiltered) and whether its proof holds:
#    cuda_profiler_ops.json, to compare with (or replace) CUDA_OPS in tests/test_backends.py, which were
#    written from published kernel names, not recorded;
# 3. the backend tests marked gpu (every device-parametrized test on cuda, and the bf16 budgets at L=1024);
# 4. `flashcheck compare --device cuda` as a person runs it (human table and JSON).
# Exit status: that of the tests (0 all passed), or 3 when there is no usable CUDA device here.
set -u
cd "$(dirname "$0")/.."
OUT="${OUT:-gpu-check-out}"
mkdir -p "$OUT"
PY="${PYTHON:-python3}"
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"

echo "== 1. environment"
if ! "$PY" - > "$OUT/environment.txt" <<'EOF'; then
import importlib.util, sys
import torch
print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda)
if not torch.cuda.is_available():
    sys.exit("no usable CUDA device: torch.cuda.is_available() is False")
print("gpu", torch.cuda.get_device_name(0), "sm%d%d" % torch.cuda.get_device_capability(0))
for name in ("pytest", "typer", "rich", "triton", "flash_attn", "flash_attn_interface", "xformers"):
    print(f"  {name}: {'yes' if importlib.util.find_spec(name) else 'no'}")
EOF
    cat "$OUT/environment.txt"
    echo "gpu_check: stopping, no CUDA device (see above)" >&2
    exit 3
fi
cat "$OUT/environment.txt"

echo "== 2. op names of CUDA runs -> $OUT/cuda_profiler_ops.json"
timeout 240 "$PY" - "$OUT/cuda_profiler_ops.json" <<'EOF'
import json, sys
import torch
from torch.profiler import ProfilerActivity, profile
from flashcheck.backends import all_backends
from flashcheck.backends.profiling import proves, select_ops

g = torch.Generator().manual_seed(0)
q, k, v = (torch.randn(1, 4, 256, 64, generator=g).bfloat16() for _ in range(3))
found = {}
for b in all_backends():
    avail = b.available(torch.bfloat16, "cuda")
    if not avail.ok:
        found[b.name] = {"skipped": avail.reason}
        continue
    try:
        b.run(q, k, v, device="cuda")  # warm-up: compile (flex), cuDNN plans, lazy loads
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            b.run(q, k, v, device="cuda")
            torch.cuda.synchronize()
    except Exception as exc:  # recorded, and the other backends still run
        found[b.name] = {"error": f"{type(exc).__name__}: {exc}"[:500]}
        continue
    names = sorted({e.key for e in prof.key_averages()})
    proof = b.proof_on("cuda")
    found[b.name] = {"proof": list(proof), "proves": proves(select_ops(names, proof), proof), "ops": names}
    print(f"  {b.name:<15} proof holds: {found[b.name]['proves']}")
json.dump(found, open(sys.argv[1], "w"), indent=1)
EOF

echo "== 3. pytest -m gpu tests/test_backends.py"
timeout 420 "$PY" -m pytest -q -m gpu tests/test_backends.py -p no:cacheprovider -rs --junitxml="$OUT/pytest-gpu.xml" \
    2>&1 | tee "$OUT/pytest-gpu.txt"
status=${PIPESTATUS[0]}

echo "== 4. flashcheck compare --device cuda"
CLI=(-m flashcheck.cli compare --backend sdpa-math,sdpa-flash,sdpa-efficient,sdpa-cudnn,flex --seq-len 1024
     --heads 8 --backward --device cuda)
timeout 120 "$PY" "${CLI[@]}" 2>&1 | tee "$OUT/compare-cuda.txt"
timeout 120 "$PY" "${CLI[@]}" --json > "$OUT/compare-cuda.json" 2> "$OUT/compare-cuda.stderr"
echo "gpu_check: tests exit status $status; files in $OUT"
exit "$status"
