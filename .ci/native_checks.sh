#!/usr/bin/env bash
# CI: the simulators' C (src/flashcheck/kernels/native/c) checked like C. Usage: .ci/native_checks.sh [PYTHON]
# 1. every .c compiled with -Wall -Wextra -Werror at each -march the builder may meet: this CPU's (the
#    builder's -march=native), the generic x86-64 (no AVX-512: the fallback paths) and x86-64-v4 (AVX-512: the
#    intrinsic paths, compiled even where this CPU lacks them);
# 2. the formatting against .clang-format, where clang-format is installed (pinned in constraints.txt);
# 3. the native tests against builds with AddressSanitizer and UBSan (FLASHCHECK_NATIVE_SANITIZE=1: cbuild's
#    sanitized flags, a cache folder of their own), libasan preloaded into Python; any report fails the run.
set -euo pipefail
cd "$(dirname "$0")/.."
py="${1:-python}"
shift || true
cc="${CC:-cc}"
src=src/flashcheck/kernels/native/c
flags=(-O3 -fPIC -ffp-contract=off -fno-fast-math -Wall -Wextra -Werror -c -o /dev/null)
marches=(native)
[ "$(uname -m)" = x86_64 ] && marches+=(x86-64 x86-64-v4)
fail=0
for march in "${marches[@]}"; do
  for f in "$src"/*.c; do
    if ! "$cc" "${flags[@]}" -march="$march" "$f"; then echo "FAIL: $f with -march=$march" >&2; fail=1; fi
  done
done
[ "$fail" -eq 0 ] || exit 1
echo "native C: $(ls "$src"/*.c | wc -l) files compile warning-free at -march=${marches[*]}"

cf=$(dirname "$(command -v "$py")")/clang-format  # the test extra's, beside the venv's python (not on CI's PATH)
[ -x "$cf" ] || cf=$(command -v clang-format || true)
if [ -n "$cf" ] && [ -x "$cf" ]; then
  "$cf" --dry-run --Werror "$src"/*.c "$src"/*.h
  echo "native C: formatted as .clang-format says"
else
  echo "native C: clang-format not installed: formatting not checked"
fi

asan=$("$cc" -print-file-name=libasan.so)
[ -f "$asan" ] || { echo "no libasan for $cc: the sanitized run cannot start" >&2; exit 1; }
cache=$(mktemp -d)
trap 'rm -rf "$cache"' EXIT
mkdir "$cache/reports"
# Python's own allocations are not ours to judge (leaks at exit); any UB or bad access stops the process. The
# reports go to files: pytest's capture of stderr dies with an aborted process
export ASAN_OPTIONS=detect_leaks=0:abort_on_error=1:halt_on_error=1:log_path=$cache/reports/asan
export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1:log_path=$cache/reports/ubsan
tests=(tests/test_native.py tests/test_native_step.py tests/test_native_backward.py tests/test_native_selftest.py
       tests/test_native_mask.py tests/test_mma_native.py tests/test_mma_finalise.py tests/test_preset_native.py
       tests/test_fp8_native.py tests/test_mma.py)
rc=0
FLASHCHECK_NATIVE_SANITIZE=1 FLASHCHECK_CACHE="$cache" LD_PRELOAD="$asan" \
  "$py" -m pytest -q -p no:cacheprovider -n 0 "${tests[@]}" "$@" || rc=$?
if ls "$cache"/reports/* >/dev/null 2>&1; then
  cat "$cache"/reports/* >&2
  echo "native C: the sanitizers reported the above" >&2
  exit 1
fi
[ "$rc" -eq 0 ] || exit "$rc"
n=$(ls "$cache"/native-sanitized/*.so 2>/dev/null | wc -l)
[ "$n" -ge 6 ] || { echo "only $n sanitized libraries were built: the run did not exercise them all" >&2; exit 1; }
echo "native C: the native tests passed against $n sanitized libraries (ASan + UBSan)"
