"""A circuit breaker: pin the fallback after N faults within a window, probe the preferred after a cooldown."""

from __future__ import annotations

import threading
from collections import deque

from flashcheck.guard.config import BreakerConfig

CLOSED, OPEN, HALF_OPEN = "closed", "open", "half-open"


class CircuitBreaker:
    """closed: calls try the preferred backend. open: they go to the fallback until `cooldown_s` has passed.
    half-open: one call (the probe) tries the preferred; its success closes the breaker, a fault reopens it.

    Times are in seconds of the caller's clock. `config=None` gives a breaker that never opens. Thread-safe."""

    def __init__(self, config: BreakerConfig | None) -> None:
        self.config = config
        self._faults: deque[float] = deque()
        self._state = CLOSED
        self._opened_at = 0.0
        self._lock = threading.Lock()
        self.opened = 0  # times it opened
        self.closed_again = 0  # times a probe succeeded

    @property
    def state(self) -> str:
        return self._state

    def allow(self, now: float) -> bool:
        """Whether this call may try the preferred backend (at most one probe at a time when half-open)."""
        with self._lock:
            if self._state == CLOSED:
                return True
            if self._state == OPEN and now - self._opened_at >= self.config.cooldown_s:
                self._state = HALF_OPEN
                return True
            return False

    def success(self) -> str | None:
        """Record a good call of the preferred; returns "closed" when that closed the breaker."""
        with self._lock:
            if self._state != HALF_OPEN:
                return None
            self._state = CLOSED
            self._faults.clear()
            self.closed_again += 1
            return CLOSED

    def failure(self, now: float) -> str | None:
        """Record a fault of the preferred at time `now`; returns "open" when that opened the breaker."""
        if self.config is None:
            return None
        with self._lock:
            self._faults.append(now)
            while self._faults and now - self._faults[0] > self.config.window_s:
                self._faults.popleft()
            if self._state == HALF_OPEN or (self._state == CLOSED and len(self._faults) >= self.config.faults):
                self._state = OPEN
                self._opened_at = now
                self.opened += 1
                return OPEN
            return None
