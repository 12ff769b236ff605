"""The editor's compute thread (ctrlg.app.compute): one thread runs every model call, results
and exceptions come back to the caller; the editor's weight format (auto, float32, bfloat16, int8)."""

import threading

import pytest
from app_fixtures import live_server, tiny_model
from test_app import call

from ctrlg.app import create_app
from ctrlg.app.compute import ComputeThread


def test_calls_run_in_order_on_one_thread_and_raise_in_the_caller():
    compute = ComputeThread(threads=1)
    try:
        names = {compute.run(lambda: threading.current_thread().name) for _ in range(5)}
        assert len(names) == 1 and next(iter(names)).startswith("ctrlg-compute")
        assert compute.run(lambda a, b=0: a + b, 2, b=3) == 5
        import torch
        assert compute.run(torch.get_num_threads) == 1
        with pytest.raises(ZeroDivisionError):
            compute.run(lambda: 1 / 0)
        assert compute.run(lambda: "still serving") == "still serving"
    finally:
        compute.shutdown()


def test_every_forward_of_a_request_runs_on_the_editors_compute_thread(smollm2_tokenizer):
    model, hmm = tiny_model(smollm2_tokenizer)
    threads = []
    handle = model.register_forward_pre_hook(lambda m, args: threads.append(threading.current_thread().name))
    compute = ComputeThread()
    try:
        with live_server(create_app(model, smollm2_tokenizer, hmm, compute=compute)) as base:
            for mode in ("ctrlg", "logical"):
                status, body = call(base, "/api/generate", {"prefix": "The cat sat.", "keyphrases": ["river"],
                                                            "min_words": 2, "max_words": 6, "mode": mode,
                                                            "max_new_tokens": 8, "num_candidates": 2})
                assert status == 200 and body["candidates"], body
    finally:
        handle.remove()
        compute.shutdown()
    assert threads and {t.split("_")[0] for t in threads} == {"ctrlg-compute"}


def test_services_built_without_one_share_the_process_compute_thread(smollm2_tokenizer):
    from ctrlg.app.compute import shared_compute_thread
    from ctrlg.app.service import EditorService

    model, hmm = tiny_model(smollm2_tokenizer)
    first, second = (EditorService(model, smollm2_tokenizer, hmm) for _ in range(2))
    assert first.compute is second.compute is shared_compute_thread()
    own = ComputeThread()
    try:
        assert EditorService(model, smollm2_tokenizer, hmm, compute=own).compute is own
    finally:
        own.shutdown()


def test_the_editor_weight_format(monkeypatch):
    import ctrlg.app.__main__ as editor

    assert editor.parse_args([]).weights == "auto"
    assert editor.parse_args(["--int8-weights"]).weights == "int8"
    assert editor.parse_args(["--weights", "float32"]).weights == "float32"
    monkeypatch.setattr(editor, "native_bf16", lambda: True)
    assert editor.weight_format("auto") == "bfloat16"
    monkeypatch.setattr(editor, "native_bf16", lambda: False)
    assert editor.weight_format("auto") == "int8"
    assert editor.weight_format("float32") == "float32"
    with pytest.raises(ValueError, match="weights='fp8'"):
        editor.weight_format("fp8")
