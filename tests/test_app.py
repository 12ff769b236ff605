"""The editor's JSON API on a live server with a tiny LM/HMM (SmolLM2's tokenizer, an HMM with
h = 6 as both guide and LM): candidates meet keyphrases, banned words and the word range (checked
on the text and with the DFA), errors are 4xx JSON, concurrent requests stay correct and never
overlap on the model, cancellation and the time budget stop a request."""

import json
import re
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

from app_fixtures import live_server, tiny_model  # noqa: E402
from ctrlg import dfa  # noqa: E402
from ctrlg.app import Limits, create_app  # noqa: E402
from ctrlg.dfa.edit_constraint import EditConstraint, build_constraint  # noqa: E402


def call(base, path, body=None, raw: bytes | None = None):
    data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
    request = urllib.request.Request(base + path, data=data, method="GET" if data is None else "POST",
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


@pytest.fixture(scope="module")
def tiny(smollm2_tokenizer):
    model, hmm = tiny_model(smollm2_tokenizer)
    return model, smollm2_tokenizer, hmm


@pytest.fixture(scope="module")
def server(tiny):
    model, tokenizer, hmm = tiny
    with live_server(create_app(model, tokenizer, hmm)) as base:
        yield base


def whole_word(phrase: str, text: str) -> bool:
    forms = "|".join(re.escape(f) for f in {phrase, phrase[:1].upper() + phrase[1:]})
    return re.search(rf"(?<![0-9A-Za-z])({forms})(?![0-9A-Za-z])", text) is not None


def check_candidates(response, tokenizer, body):
    """String checks and the DFA check (the prefix ends without a space and the suffix starts
    with one, so the candidate text is exactly the model's middle)."""
    assert response["candidates"], response
    spec = EditConstraint.from_lists(body.get("keyphrases", []), body.get("banned", []),
                                     body.get("min_words"), body.get("max_words"),
                                     body.get("allow_newlines", True))
    constraint = build_constraint(tokenizer, spec, len(tokenizer), [tokenizer.eos_token_id])
    for candidate in response["candidates"]:
        text = candidate["text"]
        assert isinstance(candidate["log_likelihood"], float) and candidate["log_likelihood"] < 0
        for phrase in spec.keyphrases:
            assert whole_word(phrase, text), (phrase, text)
        for word in spec.banned:
            assert not whole_word(word, text), (word, text)
        assert spec.allow_newlines or "\n" not in text
        words = dfa.count_words(text)
        assert (spec.min_words or 0) <= words <= (spec.max_words if spec.max_words is not None else 10**9)
        ids = tokenizer.encode(text, add_special_tokens=False) + [tokenizer.eos_token_id]
        assert constraint.accepts(ids), text
    lls = [c["log_likelihood"] for c in response["candidates"]]
    assert lls == sorted(lls, reverse=True)


@pytest.mark.parametrize("mode", ["ctrlg", "logical"])
@pytest.mark.parametrize("suffix", ["", " The dog ran in the park."])
def test_candidates_satisfy_keyphrases_banned_words_and_word_range(server, tiny, mode, suffix):
    body = {"prefix": "The old cat sat on the mat.", "suffix": suffix,
            "keyphrases": ["bright lamp", "river"], "banned": ["dog", "the"], "min_words": 4,
            "max_words": 9, "num_candidates": 3, "max_new_tokens": 14, "mode": mode, "seed": 3,
            "allow_newlines": bool(suffix)}
    status, response = call(server, "/api/generate", body)
    assert status == 200, response
    check_candidates(response, tiny[1], body)
    assert response["seconds"] > 0


def test_same_seed_same_candidates_and_empty_prefix(server):
    body = {"prefix": "", "keyphrases": ["garden"], "max_new_tokens": 8, "num_candidates": 2}
    first, second = call(server, "/api/generate", body), call(server, "/api/generate", body)
    assert first[0] == 200 and first[1]["candidates"] == second[1]["candidates"]


def test_whitespace_at_the_cursor_is_normalised(server):
    # cursor after a space and before a word: the candidate drops its leading space and gets a
    # trailing one, so prefix + text + suffix reads as one text
    status, response = call(server, "/api/generate", {
        "prefix": "The cat sat ", "suffix": "near the door.", "keyphrases": ["lamp"],
        "max_new_tokens": 8, "num_candidates": 2})
    assert status == 200
    for candidate in response["candidates"]:
        assert not candidate["text"].startswith(" ") and candidate["text"].endswith(" ")


BAD_BODIES = {
    "malformed JSON": b'{"prefix": "a",',
    "not an object": b'["prefix"]',
    "wrong type": {"prefix": 3},
    "unknown field (a path)": {"prefix": "a", "model": "/etc/passwd"},
    "over-long prefix": {"prefix": "a" * 20_001},
    "too many keyphrases": {"prefix": "a", "keyphrases": ["x"] * 6},
    "over-long keyphrase": {"prefix": "a", "keyphrases": ["x" * 65]},
    "inverted word range": {"prefix": "a", "min_words": 5, "max_words": 2},
    "too many candidates": {"prefix": "a", "num_candidates": 9},
    "unknown mode": {"prefix": "a", "mode": "beam"},
    "bad request id": {"prefix": "a", "request_id": "../x"},
    "keyphrase also banned": {"prefix": "a", "keyphrases": ["dog"], "banned": ["Dog"]},
    "budget too small": {"prefix": "a", "min_words": 20, "max_new_tokens": 4},
}


@pytest.mark.parametrize("name", list(BAD_BODIES))
def test_errors_are_4xx_json_and_the_server_keeps_serving(server, name):
    bad = BAD_BODIES[name]
    status, response = call(server, "/api/generate", **({"raw": bad} if isinstance(bad, bytes) else {"body": bad}))
    assert 400 <= status < 500 and set(response) == {"error"}, (status, response)
    assert isinstance(response["error"], str) and len(response["error"]) > 10
    assert call(server, "/api/health")[1]["status"] == "ok"


def test_error_messages_name_the_problem(server):
    assert "max_new_tokens=4" in call(server, "/api/generate", BAD_BODIES["budget too small"])[1]["error"]
    assert "dog" in call(server, "/api/generate", BAD_BODIES["keyphrase also banned"])[1]["error"].lower()
    assert "prefix" in call(server, "/api/generate", BAD_BODIES["over-long prefix"])[1]["error"]
    assert call(server, "/api/progress/nope") == (404, {"error": "no request with id 'nope'"})
    status, _ = call(server, "/api/nothing-here")
    assert status == 404


def test_concurrent_requests_stay_correct_and_never_overlap_on_the_model(server, tiny):
    model = tiny[0]
    type(model).max_active = 0
    bodies = [{"prefix": "The cat sat.", "keyphrases": [k], "banned": [b], "min_words": 2,
               "max_words": 6, "max_new_tokens": 8, "num_candidates": 2, "seed": i}
              for i, (k, b) in enumerate([("river", "lamp"), ("lamp", "river"), ("garden", "tree"),
                                          ("tree", "garden")])]
    with ThreadPoolExecutor(len(bodies)) as pool:
        results = list(pool.map(lambda b: call(server, "/api/generate", b), bodies))
    for body, (status, response) in zip(bodies, results):
        assert status == 200, response
        check_candidates(response, tiny[1], body)
    assert type(model).max_active == 1


def test_cancel_stops_a_running_request(server):
    body = {"prefix": "The cat sat.", "max_new_tokens": 120, "num_candidates": 2,
            "request_id": "cancel-me"}
    outcome = {}
    worker = threading.Thread(target=lambda: outcome.setdefault("r", call(server, "/api/generate", body)))
    worker.start()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        status, progress = call(server, "/api/progress/cancel-me")
        if status == 200 and progress["state"] == "generating" and progress["tokens"] >= 2:
            break
        time.sleep(0.02)
    assert progress["state"] == "generating", progress
    assert call(server, "/api/cancel/cancel-me", raw=b"") == (200, {"request_id": "cancel-me", "cancelled": True})
    worker.join(30)
    status, response = outcome["r"]
    assert status == 409 and "cancelled" in response["error"]
    final = call(server, "/api/progress/cancel-me")[1]
    assert final["state"] == "cancelled" and final["tokens"] < 120


def test_time_budget_is_honoured(tiny):
    model, tokenizer, hmm = tiny
    with live_server(create_app(model, tokenizer, hmm, limits=Limits(time_budget_s=0.5))) as base:
        start = time.monotonic()
        status, response = call(base, "/api/generate", {"prefix": "The cat sat.", "max_new_tokens": 120,
                                                        "num_candidates": 2})
        elapsed = time.monotonic() - start
    assert elapsed < 10
    # samples that ended (EOS) before the budget ran out are returned; otherwise a 408
    assert (status == 408 and "time budget" in response["error"]) or \
        (status == 200 and all(dfa.count_words(c["text"]) < 120 for c in response["candidates"]))


def test_logical_only_server_and_pages(tiny):
    model, tokenizer, _ = tiny
    with live_server(create_app(model, tokenizer, None)) as base:
        health = call(base, "/api/health")[1]
        assert health["modes"] == ["logical"] and health["hmm_hidden_size"] is None
        status, response = call(base, "/api/generate", {"prefix": "a", "mode": "ctrlg"})
        assert status == 422 and "HMM" in response["error"]
        assert call(base, "/api/generate", {"prefix": "a", "mode": "logical", "max_new_tokens": 4,
                                            "keyphrases": ["tree"]})[0] == 200
        page = urllib.request.urlopen(base + "/").read().decode()
        assert '<textarea id="document"' in page and "cdn" not in page.lower()
        for asset in ("app.js", "app.css"):
            assert urllib.request.urlopen(f"{base}/static/{asset}").status == 200
        schema = call(base, "/openapi.json")[1]
        assert {"/api/health", "/api/generate"} <= set(schema["paths"])
        examples = call(base, "/api/examples")[1]
        assert len(examples) == 20 and {"domain", "code", "text"} == set(examples[0])


def test_cli_binds_loopback_and_serves_the_editing_lm_by_default():
    from ctrlg.app.__main__ import parse_args

    args = parse_args([])
    assert (args.host, args.port, args.model) == ("127.0.0.1", 8000, None)
    assert (args.adapter, args.hmm) == ("stories-continue", "stories-continue-h512")


def raw_request(base, method, path, headers, body=b""):
    import http.client

    host, port = base.removeprefix("http://").split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=60)
    connection.putrequest(method, path, skip_host=True, skip_accept_encoding=True)
    for key, value in headers.items():
        connection.putheader(key, value)
    connection.endheaders()
    if isinstance(body, list):                      # chunked
        for chunk in body:
            connection.send(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
        connection.send(b"0\r\n\r\n")
    elif body:
        connection.send(body)
    response = connection.getresponse()
    return response.status, json.loads(response.read() or b"null")


def test_requests_for_another_host_are_refused(server):
    """A page on another site whose name resolves to this address (DNS rebinding) sends its own
    Host header: refused before anything runs."""
    port = server.rsplit(":", 1)[1]
    for host in ("evil.example", "evil.example:" + port, "127.0.0.2:" + port):
        status, body = raw_request(server, "GET", "/api/health", {"Host": host})
        assert status == 400 and "not served here" in body["error"], host
    for host in ("127.0.0.1:" + port, "localhost:" + port, "localhost"):
        assert raw_request(server, "GET", "/api/health", {"Host": host})[0] == 200
    from ctrlg.app.server import host_name
    assert host_name("[::1]:8000") == "::1" and host_name("LocalHost:80") == "localhost"
    assert host_name("::1") == "::1"


def test_an_oversized_body_is_refused_before_it_is_read(server):
    host = server.removeprefix("http://")
    huge = 200 * 2**20
    status, body = raw_request(server, "POST", "/api/generate",
                               {"Host": host, "Content-Type": "application/json",
                                "Content-Length": str(huge)})      # nothing follows
    assert status == 413 and "exceeds" in body["error"]
    chunks = [b"x" * 65536] * 8                                      # 512 KiB, chunked
    status, body = raw_request(server, "POST", "/api/generate",
                               {"Host": host, "Content-Type": "application/json",
                                "Transfer-Encoding": "chunked"}, chunks)
    assert status == 413
    assert call(server, "/api/generate", {"prefix": "a", "max_new_tokens": 2})[0] == 200


def test_refused_requests_never_evict_a_running_job(tiny, monkeypatch):
    """A flood of requests refused with 429 leaves the running job's progress and cancel working."""
    from ctrlg.app import service as service_module

    model, tokenizer, hmm = tiny
    release, real = threading.Event(), service_module.guided_generate

    def held(*args, **kwargs):                 # the running request holds the model until released
        release.wait(60)
        return real(*args, **kwargs)

    monkeypatch.setattr(service_module, "guided_generate", held)
    limits = Limits(max_queue=1, max_jobs_kept=4)
    with live_server(create_app(model, tokenizer, hmm, limits=limits)) as base:
        body = {"prefix": "The cat sat.", "max_new_tokens": 8, "num_candidates": 2}
        workers = [threading.Thread(target=call, args=(base, "/api/generate", {**body, "request_id": name}))
                   for name in ("long-one", "waiting-one")]
        workers[0].start()
        deadline = time.monotonic() + 60
        while (call(base, "/api/progress/long-one")[1].get("state") != "generating"
               and time.monotonic() < deadline):
            time.sleep(0.02)
        workers[1].start()                      # takes the one queue place
        while call(base, "/api/health")[1]["queued"] < 1 and time.monotonic() < deadline:
            time.sleep(0.02)
        refused = [call(base, "/api/generate", {**body, "request_id": f"flood-{i}"})[0]
                   for i in range(12)]
        assert refused == [429] * 12
        status, progress = call(base, "/api/progress/long-one")
        assert status == 200 and progress["state"] == "generating"
        assert call(base, "/api/progress/waiting-one")[0] == 200
        assert call(base, "/api/cancel/long-one", raw=b"")[1]["cancelled"] is True
        release.set()
        for worker in workers:
            worker.join(60)
        assert call(base, "/api/progress/long-one")[1]["state"] == "cancelled"


def test_constraint_building_honours_the_deadline_and_leaves_the_model_free(tiny, monkeypatch):
    """Building a constraint runs outside the model lock and stops at the request's deadline."""
    from ctrlg.app import service as service_module

    model, tokenizer, hmm = tiny
    real = service_module.build_constraint
    started = threading.Event()

    def slow_build(*args, check=None, **kwargs):
        started.set()
        for _ in range(400):             # a build that would take 20 s
            time.sleep(0.05)
            check()
        return real(*args, check=check, **kwargs)

    monkeypatch.setattr(service_module, "build_constraint", slow_build)
    app = create_app(model, tokenizer, hmm, limits=Limits(time_budget_s=1.0))
    with live_server(app) as base:
        start = time.monotonic()
        status, response = call(base, "/api/generate", {"prefix": "a", "keyphrases": ["tree"],
                                                        "max_new_tokens": 4})
        assert status == 408 and "building its constraint" in response["error"]
        assert time.monotonic() - start < 5
        assert not app.state.service._model_lock.locked()


def test_a_keyphrase_longer_than_the_word_range_is_refused_at_once(server):
    start = time.monotonic()
    status, response = call(server, "/api/generate", {
        "prefix": "a", "keyphrases": ["one two three four five six seven eight nine ten"] * 1 +
        ["a b c d e f g h i j"], "banned": [f"w{i}" for i in range(12)], "max_words": 5})
    assert status == 422 and "at most 5 words" in response["error"]
    assert time.monotonic() - start < 5


def test_trim_drops_a_symbol_tail_only_while_the_dfa_still_accepts(tiny):
    from ctrlg.app import EditorService

    model, tokenizer, hmm = tiny
    service = EditorService(model, tokenizer, hmm)
    V, eos = len(tokenizer), tokenizer.eos_token_id
    ids = tokenizer.encode(" He made walls of the ... , _ , . .", add_special_tokens=False)
    trimmed = service._trim(ids + [eos], dfa.universal(V))
    assert tokenizer.decode(trimmed) == " He made walls of the ..."
    words_only = tokenizer.encode(" He made walls , _ ,", add_special_tokens=False)
    assert tokenizer.decode(service._trim(words_only, dfa.universal(V))) == " He made walls"
    exact_length = dfa.length(len(ids) + 1, len(ids) + 1, vocab_size=V)   # EOS counts
    assert service._trim(ids + [eos], exact_length) == ids


def test_a_client_that_disconnects_cancels_its_request(server):
    import http.client

    host, port = server.removeprefix("http://").split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=30)
    connection.request("POST", "/api/generate", json.dumps(
        {"prefix": "The cat sat.", "max_new_tokens": 120, "num_candidates": 2,
         "request_id": "walk-away"}), {"Content-Type": "application/json"})
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        status, progress = call(server, "/api/progress/walk-away")
        if status == 200 and progress["state"] == "generating":
            break
        time.sleep(0.02)
    connection.close()                      # the writer closed the tab
    while time.monotonic() < deadline:
        progress = call(server, "/api/progress/walk-away")[1]
        if progress["state"] != "generating":
            break
        time.sleep(0.05)
    assert progress["state"] == "cancelled" and progress["tokens"] < 120, progress


def test_a_full_queue_answers_429(tiny):
    model, tokenizer, hmm = tiny
    with live_server(create_app(model, tokenizer, hmm, limits=Limits(max_queue=0))) as base:
        status, response = call(base, "/api/generate", {"prefix": "a", "max_new_tokens": 2})
        assert status == 429 and "waiting" in response["error"]
        assert call(base, "/api/health")[1]["queued"] == 0


def test_a_request_encodes_its_prompt_once_and_the_next_one_at_the_same_place_not_at_all(tiny, encoded_contexts):
    """Sampling and the rerank share one encoding of the prompt; a second request with the same
    prefix reads the kept one (and returns what a fresh service returns for its seed)."""
    from ctrlg.app.schemas import GenerateRequest
    from ctrlg.app.service import EditorService

    model, tokenizer, hmm = tiny
    encoded = encoded_contexts
    body = {"prefix": "The old dog sat by the door.", "suffix": " The night was quiet.",
            "keyphrases": ["garden"], "min_words": 3, "max_words": 12, "num_candidates": 3,
            "max_new_tokens": 24}

    def ask(service, seed):
        request = GenerateRequest(**body, seed=seed)
        return service.generate(request, service.open_job(None, request.max_new_tokens))["candidates"]
    service = EditorService(model, tokenizer, hmm)
    first = ask(service, 1)
    assert len(encoded) == 1 and first
    second = ask(service, 2)
    assert len(encoded) == 1
    service.forget_prompts()
    assert ask(service, 2) == second and len(encoded) == 2
    assert ask(EditorService(model, tokenizer, hmm), 2) == second
