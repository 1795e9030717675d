"""Shadow checks: recompute a sample of calls in higher precision and judge the served output by the budget rule.

A check recomputes at most `max_heads` (batch, head) slices of the call (attention is independent per
slice, so a subset is checked exactly) with the reference backend at `reference_dtype`, and the same slices
with the same-precision baseline; the served output passes when its error is within k x the baseline's
error + the rounding floor of its dtype."""

from __future__ import annotations

import logging
import queue
import random
import threading
from collections.abc import Callable
from dataclasses import dataclass

import torch

import flashcheck.guard.adapters as adapters
from flashcheck.guard.allowance import rounding_allowance
from flashcheck.guard.config import ShadowConfig

log = logging.getLogger("flashcheck.guard")


@dataclass(frozen=True, slots=True)
class ShadowResult:
    """One check of a served output against the reference: errors over the checked slices, and the verdict."""

    site: str
    call: int
    served_by: str
    max_abs: float
    rel_l2: float
    bound: float
    """The budget's bound on the max error (k x baseline error + floor)."""
    passed: bool
    failed: tuple[str, ...] = ()
    """The budget's failed checks, as "name value > bound"."""

    @property
    def ratio(self) -> float:
        """max_abs / bound (> 1: over budget)."""
        return self.max_abs / self.bound if self.bound > 0 else (0.0 if self.max_abs == 0 else float("inf"))


@dataclass(slots=True)
class ShadowJob:
    """The tensors of one sampled call (already narrowed to the checked slices)."""

    site: str
    call: int
    served_by: str
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    out: torch.Tensor
    causal: bool
    scale: float | None
    mask: torch.Tensor | None
    working: torch.dtype | None = None
    """The served kernel's working format where lower than fp32 (adapters.working_dtype)."""


class Sampler:
    """Which calls are checked (every N-th of a site, or with a probability) and which slices. Not thread-safe:
    the guard calls it under its lock."""

    def __init__(self, cfg: ShadowConfig) -> None:
        self.cfg = cfg
        self._rng = random.Random(cfg.seed)

    def take(self, site_call: int) -> bool:
        c = self.cfg
        if c.every and site_call % c.every == 0:
            return True
        return c.probability > 0 and self._rng.random() < c.probability

    def slices(self, n: int) -> list[int] | None:
        """Indices of the (batch, head) slices to check out of `n` (None: all of them)."""
        m = self.cfg.max_heads
        return None if m is None or n <= m else sorted(self._rng.sample(range(n), m))


def make_job(
    site: str, call: int, served_by: str, q, k, v, out, causal, scale, mask, idx, copy: bool, working=None
) -> ShadowJob:
    """Narrow q, k, v [B, H, L, D], out and the mask to the slices `idx` of B*H (as [1, n, L, D])."""
    b, h, lq, lk = q.shape[0], q.shape[1], q.shape[-2], k.shape[-2]

    def pick(t: torch.Tensor) -> torch.Tensor:
        t = t.detach().reshape(b * h, *t.shape[2:])
        t = t if idx is None else t[torch.tensor(idx, device=t.device)]
        t = t.unsqueeze(0)
        return t.clone() if copy and idx is None else t

    m = None if mask is None else pick(mask.expand(b, h, lq, lk))
    return ShadowJob(site, call, served_by, pick(q), pick(k), pick(v), pick(out), causal, scale, m, working)


class ShadowChecker:
    """Runs checks with the reference and baseline backends; inline, or on a worker thread with a bounded queue."""

    def __init__(
        self,
        cfg: ShadowConfig,
        record: Callable[[ShadowResult, float], None],
        fail: Callable[[str, str], None],
        clock: Callable[[], float],
    ):
        self.cfg = cfg
        self.reference = adapters.resolve(cfg.reference)
        self.baseline = adapters.resolve(cfg.baseline)
        self._record, self._fail, self._clock = record, fail, clock
        self._queue: queue.Queue[ShadowJob | None] | None = None
        self._thread: threading.Thread | None = None
        self._start_lock = threading.Lock()

    def check(self, job: ShadowJob) -> ShadowResult:
        """The verdict on one job (runs the reference and the baseline now)."""
        c = self.cfg
        with torch.no_grad():
            hi = [t.to(c.reference_dtype) for t in (job.q, job.k, job.v)]
            hmask = job.mask if job.mask is None or job.mask.dtype == torch.bool else job.mask.to(c.reference_dtype)
            ref = adapters.run(self.reference, *hi, causal=job.causal, scale=job.scale, mask=hmask)
            base = adapters.run(self.baseline, job.q, job.k, job.v, causal=job.causal, scale=job.scale, mask=job.mask)
            floor = rounding_allowance(
                job.q,
                job.k,
                job.v,
                ref,
                job.out.dtype,
                job.scale,
                causal=job.causal,
                mask=job.mask,
                working=job.working,
            )
            res = adapters.budget(job.out, ref, base, c.k, c.rule, floor=floor)
            rel = adapters.rel_l2(job.out, ref)
        mx = res.checks[0]
        failed = tuple(f"{x.name} {x.value:.3e} > {x.bound:.3e}" for x in res.failed())
        return ShadowResult(job.site, job.call, job.served_by, mx.value, rel, mx.bound, res.passed, failed)

    def submit(self, job: ShadowJob) -> bool:
        """Check `job` now, or queue it for the worker; False when the queue was full (the job is dropped)."""
        if not self.cfg.background:
            self._run(job)
            return True
        self._ensure_worker()
        try:
            self._queue.put_nowait(job)
        except queue.Full:
            return False
        return True

    def _run(self, job: ShadowJob) -> None:
        t0 = self._clock()
        try:
            result = self.check(job)
        except Exception as e:  # a broken reference must not break the served call
            log.exception("shadow check of site %s call %d failed to run", job.site, job.call)
            self._fail(job.site, f"{type(e).__name__}: {e}")
            return
        self._record(result, self._clock() - t0)

    def _ensure_worker(self) -> None:
        with self._start_lock:
            if self._thread is None:
                self._queue = queue.Queue(maxsize=self.cfg.queue_size)
                self._thread = threading.Thread(target=self._work, name="flashcheck-guard-shadow", daemon=True)
                self._thread.start()

    def _work(self) -> None:
        while True:
            job = self._queue.get()
            try:
                if job is None:
                    return
                self._run(job)
            finally:
                self._queue.task_done()

    def flush(self) -> None:
        """Wait until every queued check has been recorded."""
        if self._queue is not None:
            self._queue.join()

    def close(self) -> None:
        """Finish the queued checks and stop the worker."""
        with self._start_lock:
            if self._thread is None:
                return
            self._queue.put(None)
            self._thread.join()
            self._thread, self._queue = None, None
