"""The editor's web app: ``create_app(model, tokenizer, hmm)`` → a FastAPI application.

Routes (OpenAPI schema at ``/openapi.json``):

* ``GET /`` — the editor page (static HTML/JS/CSS shipped in ``ctrlg/app/static``; no CDN);
* ``GET /api/health`` — model, HMM size, whether the model is busy and how many requests wait;
* ``GET /api/examples`` — the CoAuthor example documents;
* ``POST /api/generate`` — :class:`~ctrlg.app.schemas.GenerateRequest` →
  :class:`~ctrlg.app.schemas.GenerateResponse`;
* ``GET /api/progress/{request_id}`` — state and tokens generated so far;
* ``POST /api/cancel/{request_id}`` — cancel a queued or running request (it stops within one
  decoding step; a client that disconnects is cancelled the same way).

Every error is JSON ``{"error": message}`` with a 4xx status (422 invalid body or constraint,
404 unknown request, 408 time budget, 409 cancelled, 429 queue full), or 503 for a request whose
estimated memory exceeds what the server has available (refused before any work,
:mod:`ctrlg.memory`); an unexpected failure is a 500 with the same shape, and the server keeps
serving.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import threading
import time
from pathlib import Path
from typing import Sequence

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse
from fastapi.staticfiles import StaticFiles
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from ctrlg.app.compute import ComputeThread
from ctrlg.app.examples import load_examples
from ctrlg.app.schemas import ErrorResponse, GenerateRequest, GenerateResponse, Progress
from ctrlg.app.service import EditorError, EditorService, Limits
from ctrlg.errors import CtrlgError, InsufficientMemoryError

__all__ = ["create_app", "background_server", "STATIC_DIR", "LOOPBACK_HOSTS", "MAX_BODY_BYTES",
           "RequestGuard"]

STATIC_DIR = Path(__file__).resolve().parent / "static"
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")
MAX_BODY_BYTES = 256 * 1024          # the largest valid request is about 2 × 20,000 characters


def host_name(header: str) -> str:
    """The host of a ``Host`` header without its port: ``[::1]:8000`` → ``::1``,
    ``localhost:8000`` → ``localhost`` (lower-cased)."""
    header = header.strip().lower()
    if header.startswith("["):
        return header[1:header.find("]")] if "]" in header else header
    return header.rsplit(":", 1)[0] if header.count(":") == 1 else header


class RequestGuard:
    """ASGI middleware in front of the editor: the ``Host`` header must name an allowed host, and
    a body may not exceed ``max_body_bytes`` (refused from its ``Content-Length`` before reading,
    or as soon as a chunked body passes the limit: the guard reads the body, then hands it on). Starlette's TrustedHostMiddleware splits an
    IPv6 literal's ``[::1]:8000`` at its first colon, hence this small guard."""

    def __init__(self, app, allowed_hosts: Sequence[str], max_body_bytes: int):
        self.app = app
        self.allowed = {h.lower() for h in allowed_hosts}
        self.max_body_bytes = int(max_body_bytes)

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        host = host_name(headers.get("host", ""))
        if "*" not in self.allowed and host not in self.allowed:
            return await self._refuse(send, 400, f"host {host!r} is not served here (allowed: "
                                                 f"{sorted(self.allowed)}); open the editor at its own address")
        length = headers.get("content-length")
        if length is not None and (not length.isdigit() or int(length) > self.max_body_bytes):
            return await self._refuse(send, 413, f"request body of {length} bytes exceeds the "
                                                 f"limit of {self.max_body_bytes} bytes")
        chunks, size = [], 0
        while True:                      # read the body here, at most max_body_bytes of it
            message = await receive()
            if message["type"] != "http.request":
                return await self.app(scope, _replay([message], receive), send)
            size += len(message.get("body", b""))
            if size > self.max_body_bytes:
                return await self._refuse(send, 413, f"request body exceeds the limit of "
                                                     f"{self.max_body_bytes} bytes")
            chunks.append(message)
            if not message.get("more_body", False):
                break
        await self.app(scope, _replay(chunks, receive), send)

    @staticmethod
    async def _refuse(send, status: int, message: str) -> None:
        body = json.dumps({"error": message}).encode()
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})


def _replay(messages: list, receive):
    """An ASGI ``receive`` that returns ``messages`` first, then defers to ``receive``."""
    pending = list(messages)

    async def replayed():
        return pending.pop(0) if pending else await receive()

    return replayed
_ERRORS = {code: {"model": ErrorResponse} for code in (404, 408, 409, 422, 429, 503)}


def _validation_message(exc: RequestValidationError) -> str:
    parts = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err.get("loc", ()) if p != "body")
        msg = err.get("msg", "invalid value")
        parts.append(f"{loc}: {msg}" if loc else msg)
    return "invalid request body: " + "; ".join(parts or ["malformed JSON"])


def create_app(model, tokenizer, hmm=None, *, limits: Limits | None = None,
               model_name: str = "custom", prompt_header: str = "",
               allowed_hosts: Sequence[str] = LOOPBACK_HOSTS,
               max_body_bytes: int = MAX_BODY_BYTES, compute: ComputeThread | None = None) -> FastAPI:
    """The editor app serving ``model`` / ``tokenizer`` / ``hmm`` (``hmm=None``: logical only).

    ``prompt_header``: what the LM reads before the writer's text (:class:`EditorService`).
    Requests whose ``Host`` header names no host of ``allowed_hosts`` (any port; ``"*"``: any
    host) are refused with 400 — a page on another site that resolves its own name to this
    address (DNS rebinding) cannot drive the editor. A body over ``max_body_bytes`` is refused
    with 413 before it is read. Tests pass tiny models; ``python -m ctrlg.app`` passes the
    editing LM and HMM. ``compute``: the thread that runs the model calls
    (:mod:`ctrlg.app.compute`; pass the one that loaded the model; default the process's shared one)."""
    service = EditorService(model, tokenizer, hmm, limits=limits, model_name=model_name,
                            prompt_header=prompt_header, compute=compute)
    app = FastAPI(title="ctrlg editor",
                  description="Constrained text editing with Ctrl-G: continue, insert or rewrite "
                              "text with keyphrases, banned words and a word range.",
                  version="1")
    app.state.service = service
    app.add_middleware(RequestGuard, allowed_hosts=allowed_hosts, max_body_bytes=max_body_bytes)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError):
        return JSONResponse({"error": _validation_message(exc)}, status_code=422)

    @app.exception_handler(EditorError)
    async def _editor_error(request: Request, exc: EditorError):
        return JSONResponse({"error": str(exc)}, status_code=exc.status)

    @app.exception_handler(CtrlgError)
    async def _ctrlg_error(request: Request, exc: CtrlgError):
        return JSONResponse({"error": str(exc)}, status_code=422)

    @app.exception_handler(InsufficientMemoryError)
    async def _no_memory(request: Request, exc: InsufficientMemoryError):
        """Refused before any work (ctrlg.memory): the server stays up for everyone else."""
        return JSONResponse({"error": str(exc)}, status_code=503)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException):
        return JSONResponse({"error": str(exc.detail)}, status_code=exc.status_code)

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception):
        return JSONResponse({"error": f"internal error: {type(exc).__name__}: {exc}"},
                            status_code=500)

    @app.get("/", include_in_schema=False)
    async def index():
        return FileResponse(STATIC_DIR / "index.html")

    app.mount("/static", StaticFiles(directory=STATIC_DIR), name="static")

    @app.get("/api/health")
    async def health() -> dict:
        """Liveness, the model and HMM being served, and the queue."""
        return {"status": "ok", "model": service.model_name, "vocab_size": service.vocab_size,
                "hmm_hidden_size": None if hmm is None else hmm.hidden_size,
                "modes": ["ctrlg", "logical"] if hmm is not None else ["logical"],
                "time_budget_s": service.limits.time_budget_s, **service.status()}

    @app.get("/api/examples")
    async def examples() -> list[dict]:
        """Example documents (CoAuthor writing prompts, MIT)."""
        return list(load_examples())

    @app.post("/api/generate", response_model=GenerateResponse, responses=_ERRORS)
    async def generate(body: GenerateRequest, request: Request):
        """Candidates for the text between ``prefix`` and ``suffix`` that satisfy the constraint,
        best LM log-likelihood first. One model call runs at a time; others wait in a queue."""
        job = service.open_job(body.request_id, body.max_new_tokens)
        task = asyncio.ensure_future(run_in_threadpool(service.generate, body, job))
        while True:
            done, _ = await asyncio.wait({task}, timeout=0.2)
            if done:
                return task.result()
            if await request.is_disconnected():
                job.cancel_event.set()

    @app.get("/api/progress/{request_id}", response_model=Progress, responses=_ERRORS)
    async def progress(request_id: str):
        """State of a request: queued, building (its constraint), generating (tokens so far),
        done, cancelled or failed."""
        return service.job(request_id).as_dict()

    @app.post("/api/cancel/{request_id}", responses=_ERRORS)
    async def cancel(request_id: str) -> dict:
        """Cancel a request; ``cancelled`` says whether it was still queued or running."""
        return {"request_id": request_id, "cancelled": service.cancel(request_id)}

    return app


def _free_port(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((host, 0))
        return probe.getsockname()[1]


@contextlib.contextmanager
def background_server(app, host: str = "127.0.0.1", port: int | None = None,
                      start_timeout: float = 20.0):
    """Serve ``app`` with uvicorn in a daemon thread (a free port by default); yields the base
    URL and stops the server on exit. For tests, benchmarks and screenshots."""
    import uvicorn

    port = _free_port(host) if port is None else int(port)
    server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="warning",
                                           lifespan="off"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + start_timeout
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            server.should_exit = True
            raise RuntimeError(f"the editor server did not start on {host}:{port}")
        time.sleep(0.02)
    try:
        yield f"http://{host}:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
