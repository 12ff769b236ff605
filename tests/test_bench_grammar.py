"""bench_grammar's split of a step's time: the full garbage collections inside a timed step are
measured (gc.callbacks) and taken out of the p99 it reports beside the plain one."""

import gc
import time

import numpy as np

from benchmarks import bench_grammar


def test_a_full_collection_inside_a_step_is_timed_and_taken_out_of_the_second_p99():
    steps = []
    for collect in (False, True, False):
        t0, gc0 = time.perf_counter(), bench_grammar.FULL_GC.total
        if collect:
            garbage = [[i] for i in range(200_000)]       # something for the collection to scan
            gc.collect(2)
            del garbage
        steps.append(bench_grammar.timed_step(t0, gc0))
    assert steps[0].gc == 0.0 and steps[2].gc == 0.0
    assert 0.0 < steps[1].gc <= steps[1]
    row = bench_grammar.mask_percentiles("x_", steps)
    assert row["x_steps_with_full_gc"] == 1 and row["x_full_gc_ms"] == 1e3 * steps[1].gc
    assert row["x_p99_ms"] == 1e3 * float(np.percentile(steps, 99))
    net = [steps[0], steps[1] - steps[1].gc, steps[2]]
    assert row["x_p99_without_full_gc_ms"] == 1e3 * float(np.percentile(net, 99))
    assert row["x_p99_without_full_gc_ms"] < row["x_p99_ms"]
