"""Timing on CPU and CUDA: warm-up runs, then the median of repeats.

On CUDA a run is bracketed by CUDA events (``torch.cuda.Event(enable_timing=True)``) and the
device is synchronised before reading them, so the figure is device time of the enqueued work;
on CPU it is ``time.perf_counter`` wall time. :class:`Stopwatch` times single sections of a
longer loop (e.g. the LM step and the guidance step of one decoding step); with ``wall=True`` it
synchronises before and after and reads ``perf_counter``, so host-side work (Python, the
tokens' round trip to the CPU) counts too — what a user waits for per generated token.
"""

from __future__ import annotations

import platform
import statistics
import time
from dataclasses import dataclass
from typing import Callable

import torch

__all__ = ["Timing", "measure", "Stopwatch", "device_name", "synchronize"]


def synchronize(device: torch.device | str) -> None:
    """Wait for all work queued on ``device`` (no-op on CPU)."""
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def device_name(device: torch.device | str) -> str:
    """``torch.cuda.get_device_name`` on CUDA, else the CPU's name (``platform.processor()``,
    falling back to ``platform.machine()`` when the platform reports none)."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    name = platform.processor() or platform.machine() or "cpu"
    try:  # Linux: the marketing name is in /proc/cpuinfo; platform.processor() is often "x86_64"
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            for line in handle:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return name


@dataclass
class Timing:
    """Seconds per call: the median (the figure we report), min, max and every repeat."""

    median_s: float
    min_s: float
    max_s: float
    repeats: list[float]

    def as_dict(self) -> dict:
        return {"median_s": self.median_s, "min_s": self.min_s, "max_s": self.max_s,
                "repeats": len(self.repeats)}


def measure(fn: Callable[[], object], device: torch.device | str, *, warmup: int = 1,
            repeats: int = 5) -> Timing:
    """Time ``fn()``: ``warmup`` untimed calls (compilation, autotuning, caches), then ``repeats``
    timed calls; returns their :class:`Timing`."""
    if repeats < 1:
        raise ValueError(f"repeats must be ≥ 1, got {repeats}")
    device = torch.device(device)
    for _ in range(max(0, warmup)):
        fn()
    synchronize(device)
    times: list[float] = []
    watch = Stopwatch(device)
    for _ in range(repeats):
        with watch:
            fn()
        times.append(watch.last_s)
    return Timing(statistics.median(times), min(times), max(times), times)


class Stopwatch:
    """Context manager timing its body: CUDA events on CUDA (``wall=False``), else synchronised
    ``perf_counter``. ``last_s`` holds the latest reading; ``laps`` all of them."""

    def __init__(self, device: torch.device | str, *, wall: bool = False):
        self.device = torch.device(device)
        self.events = self.device.type == "cuda" and not wall
        self.laps: list[float] = []
        self.last_s = float("nan")

    def __enter__(self) -> "Stopwatch":
        if self.events:
            self._start = torch.cuda.Event(enable_timing=True)
            self._end = torch.cuda.Event(enable_timing=True)
            self._start.record()
        else:
            synchronize(self.device)
            self._t0 = time.perf_counter()
        return self

    def __exit__(self, *exc) -> None:
        if self.events:
            self._end.record()
            torch.cuda.synchronize(self.device)
            self.last_s = self._start.elapsed_time(self._end) / 1e3
        else:
            synchronize(self.device)
            self.last_s = time.perf_counter() - self._t0
        self.laps.append(self.last_s)

    @property
    def median_s(self) -> float:
        return statistics.median(self.laps) if self.laps else float("nan")
