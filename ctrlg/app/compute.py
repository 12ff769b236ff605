"""One long-lived thread for the editor's torch work (loading the LM, sampling, the rerank).

PyTorch's CPU wheels run intra-op parallelism on libgomp. libgomp gives every thread that opens a
parallel region a pool of its own, and once its pools hold more threads than the machine has
cores it stops spinning between regions ("throttled" waiting): every parallel region then pays
a futex wake-up of its workers. A web server runs each request on some worker thread while the
LM was loaded on the main thread, so two pools exist and a decoding step of a 135M LM, hundreds
of small regions, pays it hundreds of times. Measured on a 2-core Xeon with two threads: a
4-row 576 → 1536 linear layer takes 61 µs on the only thread that runs torch and 150 µs on a
second one; the editor's insertion request 1.2 s against 1.9 s.

:class:`ComputeThread` keeps all of that work on one thread, so one pool exists: the editor
loads its LM through :meth:`ComputeThread.run` and :class:`ctrlg.app.service.EditorService`
makes its model calls there (they are serialised by the service's model lock anyway).
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

__all__ = ["ComputeThread", "shared_compute_thread"]

_shared: ComputeThread | None = None
_shared_lock = threading.Lock()


class ComputeThread:
    """A single worker thread that runs callables in submission order; ``threads``: the torch CPU
    threads it uses (None: torch's default)."""

    def __init__(self, threads: int | None = None):
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ctrlg-compute",
                                            initializer=_set_threads, initargs=(threads,))

    def run(self, function, *args, **kwargs):
        """``function(*args, **kwargs)`` on the compute thread; returns its result or raises its
        exception in the calling thread."""
        return self._executor.submit(function, *args, **kwargs).result()

    def shutdown(self) -> None:
        self._executor.shutdown(wait=True)


def _set_threads(threads: int | None) -> None:
    if threads:
        import torch

        torch.set_num_threads(threads)


def shared_compute_thread() -> ComputeThread:
    """The process's default :class:`ComputeThread` (created on first use, torch's default thread
    count): editor services built without one share it, so a process that serves several models
    still opens one more OpenMP pool, not one per service."""
    global _shared
    with _shared_lock:
        if _shared is None:
            _shared = ComputeThread()
        return _shared
