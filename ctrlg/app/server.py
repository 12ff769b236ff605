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
import socket
import threading
import time
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse
from fastapi.staticfiles import StaticFiles
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from ctrlg.app.examples import load_examples
from ctrlg.app.schemas import ErrorResponse, GenerateRequest, GenerateResponse, Progress
from ctrlg.app.service import EditorError, EditorService, Limits
from ctrlg.errors import CtrlgError, InsufficientMemoryError

__all__ = ["create_app", "background_server", "STATIC_DIR"]

STATIC_DIR = Path(__file__).resolve().parent / "static"
_ERRORS = {code: {"model": ErrorResponse} for code in (404, 408, 409, 422, 429, 503)}


def _validation_message(exc: RequestValidationError) -> str:
    parts = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err.get("loc", ()) if p != "body")
        msg = err.get("msg", "invalid value")
        parts.append(f"{loc}: {msg}" if loc else msg)
    return "invalid request body: " + "; ".join(parts or ["malformed JSON"])


def create_app(model, tokenizer, hmm=None, *, limits: Limits | None = None,
               model_name: str = "custom") -> FastAPI:
    """The editor app serving ``model`` / ``tokenizer`` / ``hmm`` (``hmm=None``: logical only).

    Tests pass tiny models; ``python -m ctrlg.app`` passes the embedded SmolLM2 and HMM."""
    service = EditorService(model, tokenizer, hmm, limits=limits, model_name=model_name)
    app = FastAPI(title="ctrlg editor",
                  description="Constrained text editing with Ctrl-G: continue, insert or rewrite "
                              "text with keyphrases, banned words and a word range.",
                  version="1")
    app.state.service = service

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
