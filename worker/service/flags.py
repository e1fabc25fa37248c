"""Process flags set by signal handlers (handlers only set flags; the loops act on them)."""

from __future__ import annotations

import signal
import threading
from types import FrameType


class Flags:
    """``draining``: stop intake and finish in-flight work; ``stop_now``: stop at once."""

    def __init__(self) -> None:
        self.draining = threading.Event()
        self.stop_now = threading.Event()
        self.signals = 0

    def request_drain(self) -> None:
        """First stop request: drain."""
        self.draining.set()

    def on_signal(self, signum: int, frame: FrameType | None) -> None:
        """SIGTERM/SIGINT: the first drains, the second stops at once."""
        self.signals += 1
        if self.signals == 1:
            self.request_drain()
        else:
            self.stop_now.set()
            self.draining.set()

    def install(self) -> None:
        """Route SIGTERM and SIGINT here (call from the main thread)."""
        signal.signal(signal.SIGTERM, self.on_signal)
        signal.signal(signal.SIGINT, self.on_signal)
