"""The flash simulator's forward against SDPA's fused CPU flash kernel (fp32), paired in one process.

For each thread count, policy and length: the simulator and SDPA alternate `repeats` times; the row prints
both medians, their ratio (simulator / SDPA) and the 1-minute load average before and after. Then each
kernel preset's time against the plain simulator (bf16-mixed) at one shape, and one decoding step over 128k keys
with each preset that models the tensor core's accumulator. B=1, H=8, D=64.
    python benchmarks/bench_speed.py                           # L = 2k..32k, 1 and 2 threads (< 10 min idle)
    python benchmarks/bench_speed.py --lengths 2048,8192 --threads 2 --policies bf16-mixed
    python benchmarks/bench_speed.py --lengths 0               # the presets and the decoding step only
    python benchmarks/bench_speed.py --lengths 0 --preset-length 0 --decode-keys 0 --user-rows all  # issue 48's rows
The user rows (issue 48: what users run, `--user-rows`): causal attention at head dim 128 (and 64), grouped K/V
heads, the forward and forward+backward (the simulator's bf16-mixed FA2 backward against SDPA flash's backward), B=1,
H=8 (the GQA row: 32 query heads over 4 K/V heads, SDPA's enable_gqa), and a causal row with a user mask (key
padding of one sequence of 3L/4 tokens: the simulator's bool [1, 1, 1, L] with causal=True, SDPA flash's the same
folded into one bool [1, 1, L, L] attn_mask); each thread count in a process of its own.
`--user-max-length N` runs each row at min(L, N) (a quicker look); `--user-length N` at N (e.g. 16384: the top of
issue 48's 2k-16k range).
Bar (issue 35): every ratio <= 1.5; each preset within 3x of the plain simulator; a decoding step in seconds.
The simulator runs its query tiles on the cores free at each call (kernels.sim.tiles.free_cores: the load average less
its own share), SDPA on every thread it is given: on a busy machine a 2-thread row can compare one thread against
two, and the presets' rows at 2 threads flip between one and two for either side. Read 2-thread rows at load < 1;
the 1-thread rows are comparable at any load.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from flashcheck.kernels import flash_attention
from flashcheck.kernels.sim.presets import KERNEL_PRESETS, default_format, resolve


def _qkv(length: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(1, 8, length, 64, generator=g) for _ in range(3))  # type: ignore[return-value]


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _sdpa(q, k, v) -> None:
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        torch.nn.functional.scaled_dot_product_attention(q, k, v)


def _repeats(length: int, asked: int) -> int:
    return 1 if length >= 32768 else (min(asked, 3) if length >= 16384 else asked)


def paired(first, second, repeats: int) -> tuple[float, float]:
    """Medians of `repeats` runs of each, alternating (first, second, first, ...) after one warm-up of each."""
    first(), second()
    a, b = [], []
    for _ in range(repeats):
        a.append(_timed(first))
        b.append(_timed(second))
    return statistics.median(a), statistics.median(b)


def _load() -> str:
    return f"{os.getloadavg()[0]:.1f}"


def speed_table(lengths: list[int], threads: list[int], policies: list[str], repeats: int) -> None:
    print(f"{'threads':>7} {'policy':>10} {'L':>6} {'sim s':>8} {'sdpa s':>8} {'ratio':>6}  load before-after")
    for n in threads:
        torch.set_num_threads(n)
        for policy in policies:
            for length in lengths:
                q, k, v = _qkv(length)
                before = _load()
                sim, ref = paired(
                    lambda q=q, k=k, v=v, p=policy: flash_attention(q, k, v, policy=p),
                    lambda q=q, k=k, v=v: _sdpa(q, k, v),
                    _repeats(length, repeats),
                )
                print(
                    f"{n:>7} {policy:>10} {length:>6} {sim:8.3f} {ref:8.3f} {sim / ref:6.2f}  {before}-{_load()}",
                    flush=True,
                )


def preset_table(length: int, threads: int, repeats: int) -> None:
    torch.set_num_threads(threads)
    q, k, v = _qkv(length)
    print(f"\npresets against the plain simulator (bf16-mixed), L={length}, {threads} threads")
    print(f"{'preset':>16} {'preset s':>9} {'plain s':>8} {'ratio':>6}  load before-after")
    for name in KERNEL_PRESETS:
        kw = resolve(name, default_format(name), length, length, 64, False)
        before = _load()
        t_pre, t_plain = paired(
            lambda kw=kw: flash_attention(q, k, v, **kw),
            lambda: flash_attention(q, k, v, policy="bf16-mixed"),
            repeats,
        )
        print(f"{name:>16} {t_pre:9.3f} {t_plain:8.3f} {t_pre / t_plain:6.2f}  {before}-{_load()}", flush=True)


def decode_table(keys: int, threads: int) -> None:
    """One decoding step (a single query row against `keys` keys) for the plain simulator and each preset that
    models a tensor core's narrow accumulator (Policy acc_bits / qk_acc_bits), timed once after a warm-up."""
    torch.set_num_threads(threads)
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, 8, 1, 64, generator=g)
    k, v = (torch.randn(1, 8, keys, 64, generator=g) for _ in range(2))
    print(f"\none decoding step, {keys} keys, H=8, D=64, {threads} threads")
    runs = {"plain bf16-mixed": {"policy": "bf16-mixed"}}
    for name in KERNEL_PRESETS:
        kw = resolve(name, default_format(name), 1, keys, 64, False)
        if kw["policy"].acc_bits or kw["policy"].qk_acc_bits:
            runs[name] = kw
    for name, kw in runs.items():
        flash_attention(q, k[..., :256, :], v[..., :256, :], **kw)
        before = _load()
        seconds = _timed(lambda kw=kw: flash_attention(q, k, v, **kw))
        print(f"{name:>16} {seconds:8.3f} s  load {before}-{_load()}", flush=True)


# (name, H, Hkv, D, L, backward): issue 48's rows, all causal
USER_ROWS = (
    ("causal D=128", 8, 8, 128, 2048, False),
    ("causal D=128", 8, 8, 128, 8192, False),
    ("causal GQA 32:4 D=128", 32, 4, 128, 4096, False),
    ("causal fwd+bwd D=64", 8, 8, 64, 2048, True),
    ("causal fwd+bwd D=128", 8, 8, 128, 4096, True),
    ("causal+key padding D=128", 8, 8, 128, 4096, False),  # PADDED: a user mask (see _user_mask)
)
PADDED = "causal+key padding D=128"


def _user_inputs(h: int, hkv: int, d: int, length: int, grad: bool):
    g = torch.Generator().manual_seed(length + d)
    q = torch.randn(1, h, length, d, generator=g)
    k, v = (torch.randn(1, hkv, length, d, generator=g) for _ in range(2))
    dout = torch.randn(1, h, length, d, generator=g)
    return [t.requires_grad_(grad) for t in (q, k, v)], dout


def _user_run(fn, qkv, dout, backward: bool) -> None:
    if not backward:
        with torch.no_grad():
            fn(*qkv)
        return
    for t in qkv:
        t.grad = None
    fn(*qkv).backward(dout)


def _sim_causal(q, k, v, pad=None):
    return flash_attention(q, k, v, policy="bf16-mixed", causal=True, mask=pad)


def _sdpa_causal(q, k, v, mask=None):
    gqa = k.shape[1] != q.shape[1]
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        if mask is not None:  # the causal and padding masks in one (SDPA takes either is_causal or a mask)
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=gqa)
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)


def _user_mask(name: str, length: int) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """The PADDED row's masks: the key padding [1, 1, 1, L] of one sequence of 3L/4 real tokens (padding on the
    right, so every row sees a key) for the simulator, and the same with the causal mask folded in [1, 1, L, L]
    (bool) for SDPA; (None, None) for the other rows."""
    if name != PADDED:
        return None, None
    keep = torch.arange(length) < 3 * length // 4
    pad = keep.view(1, 1, 1, length)
    return pad, torch.ones(length, length, dtype=torch.bool).tril() & pad


def user_table(rows: list[int], threads: int, repeats: int, max_length: int, length_now: int = 0) -> None:
    """Issue 48's rows (USER_ROWS[i] for i in rows) at `threads` intra-op threads, in this process; each at
    length_now where given, else at its own L capped at max_length (0: no cap)."""
    torch.set_num_threads(threads)
    print(f"{'threads':>7} {'row':>22} {'L':>6} {'sim s':>8} {'sdpa s':>8} {'ratio':>6}  load before-after")
    for i in rows:
        name, h, hkv, d, length, backward = USER_ROWS[i]
        length = length_now or (min(length, max_length) if max_length else length)
        qkv, dout = _user_inputs(h, hkv, d, length, backward)
        pad, full = _user_mask(name, length)
        before = _load()
        sim, ref = paired(
            lambda qkv=qkv, dout=dout, bw=backward, m=pad: _user_run(lambda *t: _sim_causal(*t, m), qkv, dout, bw),
            lambda qkv=qkv, dout=dout, bw=backward, m=full: _user_run(lambda *t: _sdpa_causal(*t, m), qkv, dout, bw),
            _repeats(length, repeats),
        )
        print(
            f"{threads:>7} {name:>22} {length:>6} {sim:8.3f} {ref:8.3f} {sim / ref:6.2f}  {before}-{_load()}",
            flush=True,
        )


def user_tables(rows: str, threads: list[int], repeats: int, max_length: int, length_now: int = 0) -> None:
    """user_table for each thread count, each in a fresh process of its own (this script again)."""
    for n in threads:
        cmd = [sys.executable, __file__, "--lengths", "0", "--preset-length", "0", "--decode-keys", "0"]
        cmd += ["--threads", str(n), "--repeats", str(repeats), "--user-rows", rows, "--user-in-process"]
        cmd += ["--user-max-length", str(max_length), "--user-length", str(length_now)]
        subprocess.run(cmd, check=True)


def _rows(text: str) -> str:
    """An argparse type: "all", "none" or comma-separated indices into USER_ROWS."""
    if text in ("all", "none"):
        return text
    items = [x.strip() for x in text.split(",")]
    if not all(x.isdigit() and int(x) < len(USER_ROWS) for x in items):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not allowed; expected all, none or comma-separated row numbers 0-{len(USER_ROWS) - 1}"
        )
    return text


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip() and int(x) > 0]


def _counts(zero_means_none: bool):
    """An argparse type: comma-separated positive integers ("0" alone: none, where zero_means_none)."""

    def parse(text: str) -> str:
        items = [x.strip() for x in text.split(",")]
        if zero_means_none and items == ["0"]:
            return text
        if not all(x.isdigit() and int(x) > 0 for x in items):
            allowed = "positive integers" + (", or 0 for none" if zero_means_none else "")
            raise argparse.ArgumentTypeError(f"{text!r} is not allowed; expected comma-separated {allowed}")
        return text

    return parse


def _count(zero_allowed: bool, zero_means: str = "skip"):
    """An argparse type: one integer, at least 1 (or 0 where zero_allowed: `zero_means`)."""

    def parse(text: str) -> int:
        if not text.strip().isdigit() or int(text) < (0 if zero_allowed else 1):
            low = f"0 ({zero_means}) or more" if zero_allowed else "1 or more"
            raise argparse.ArgumentTypeError(f"{text!r} is not allowed; expected an integer, {low}")
        return int(text)

    return parse


def _policies(text: str) -> str:
    """An argparse type: comma-separated simulator policies (core.numerics.parse_policy's names)."""
    from flashcheck.core.numerics import parse_policy

    for name in text.split(","):
        try:
            parse_policy(name.strip())
        except (ValueError, KeyError) as exc:
            raise argparse.ArgumentTypeError(f"policy {name.strip()!r} is not allowed: {exc}") from None
    return text


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    parser.add_argument(
        "--lengths", type=_counts(True), default="2048,4096,8192,16384,32768", help="comma-separated; 0: none"
    )
    parser.add_argument("--threads", type=_counts(False), default="1,2", help="comma-separated intra-op thread counts")
    parser.add_argument("--policies", type=_policies, default="bf16-mixed,fp32", help="comma-separated policies")
    parser.add_argument("--repeats", type=_count(False), default=5, help="pairs per row (16k: at most 3, 32k: 1)")
    parser.add_argument("--preset-length", type=_count(True), default=2048, help="the presets' shape; 0: skip them")
    parser.add_argument("--decode-keys", type=_count(True), default=131072, help="a decoding step's keys; 0: skip it")
    parser.add_argument("--user-rows", type=_rows, default="none", help="issue 48's rows: all, none or 0,2,...")
    parser.add_argument(
        "--user-max-length", type=_count(True, "no cap"), default=0, help="cap each user row's L; 0: none"
    )
    parser.add_argument(
        "--user-length", type=_count(True, "each row's own"), default=0, help="run each user row at this L; 0: its own"
    )
    parser.add_argument("--user-in-process", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    t0 = time.perf_counter()
    if args.user_rows != "none":
        rows = list(range(len(USER_ROWS))) if args.user_rows == "all" else [int(x) for x in args.user_rows.split(",")]
        if args.user_in_process:
            user_table(rows, _ints(args.threads)[0], max(1, args.repeats), args.user_max_length, args.user_length)
            return
        user_tables(args.user_rows, _ints(args.threads), max(1, args.repeats), args.user_max_length, args.user_length)
    if _ints(args.lengths):
        speed_table(_ints(args.lengths), _ints(args.threads), args.policies.split(","), max(1, args.repeats))
    if args.preset_length > 0:
        preset_table(args.preset_length, max(_ints(args.threads) or [1]), 3)
    if args.decode_keys > 0:
        decode_table(args.decode_keys, max(_ints(args.threads) or [1]))
    print(f"\nwall {time.perf_counter() - t0:.0f} s, torch {torch.__version__}, load now {_load()}")
    if max(_ints(args.threads) or [1]) > 1 and os.getloadavg()[0] >= 1.0:
        print("note: at this load the simulator's 2-thread rows may have run on one thread: read them at load < 1")


if __name__ == "__main__":
    main()
