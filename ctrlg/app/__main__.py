"""``python -m ctrlg.app [--host 127.0.0.1] [--port 8000] [--model NAME] [--adapter NAME] [--hmm NAME] [--weights FORMAT]``

Serves the editor offline on the CPU. By default the LM is the embedded SmolLM2-135M-Instruct with
the ``stories-continue`` adapter (fine-tuned to continue story text, Ctrl-G §5's recipe) and the
HMM ``stories-continue-h512`` distilled from that LM's samples under its prompt (docs/models.md);
the LM reads its
instruction before the writer's text. ``--model`` takes what :func:`ctrlg.lm.models.load_model`
takes (a local folder, a ``.gguf`` file, a hub id); ``--adapter`` an embedded adapter's name, a
folder, or ``none``; ``--hmm`` an embedded HMM's name, a checkpoint folder written by
``HMM.save`` (checked against the tokenizer), or ``none`` for logical masking only;
``--weights`` says how the LM's linear layers hold their weights: ``auto`` (the default) bfloat16
where the CPU multiplies bfloat16 natively (:mod:`ctrlg.lm.bf16_weights`, next-token
distributions moved by ≈ 0.0007 nats of KL), else int8 (:mod:`ctrlg.lm.int8_weights`, ≈ 0.005
nats); ``float32`` the LM as trained; ``bfloat16`` or ``int8`` force a format
(``--int8-weights`` is ``--weights int8``). The LM is loaded, and every model call made, on one
compute thread (:mod:`ctrlg.app.compute`). Binds to
127.0.0.1 unless ``--host`` says otherwise, and answers only requests addressed to the bound
host or to loopback names (``--allowed-hosts`` adds others).
"""

from __future__ import annotations

import argparse
import ipaddress
import sys
from pathlib import Path

import uvicorn

from ctrlg.app import Limits, create_app
from ctrlg.app.compute import ComputeThread
from ctrlg.app.server import LOOPBACK_HOSTS
from ctrlg.data.story_prompts import continuation_prompt
from ctrlg.hmm import EMBEDDED_HMMS, HMM, load_embedded_hmm
from ctrlg.lm.adapters import adapter_info
from ctrlg.lm.bf16_weights import native_bf16
from ctrlg.lm.models import load_model, load_tokenizer

DEFAULT_ADAPTER = "stories-continue"
DEFAULT_HMM = "stories-continue-h512"
#: how the LM's linear layers hold their weights: float32 (the LM as trained), bfloat16 or int8
#: (approximations with faster CPU steps, :mod:`ctrlg.lm.bf16_weights`, :mod:`ctrlg.lm.int8_weights`),
#: or auto (:func:`auto_weights`)
WEIGHT_FORMATS = ("auto", "float32", "bfloat16", "int8")
DEFAULT_WEIGHTS = "auto"


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m ctrlg.app", description=__doc__.split("\n\n")[1],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--host", default="127.0.0.1", help="interface to bind (default: loopback)")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--model", default=None, help="base LM (default: the embedded SmolLM2-135M-Instruct)")
    parser.add_argument("--adapter", default=DEFAULT_ADAPTER,
                        help=f"LoRA adapter merged into the LM (default: {DEFAULT_ADAPTER}; 'none': the base alone)")
    parser.add_argument("--hmm", default=DEFAULT_HMM,
                        help=f"HMM: an embedded name or a checkpoint folder (default: {DEFAULT_HMM}); "
                             "'none' for logical masking only")
    parser.add_argument("--weights", choices=WEIGHT_FORMATS, default=DEFAULT_WEIGHTS,
                        help="how the LM's linear layers hold their weights (default: "
                             f"{DEFAULT_WEIGHTS}, see the module's docstring)")
    parser.add_argument("--int8-weights", dest="weights", action="store_const", const="int8",
                        help="the same as --weights int8")
    parser.add_argument("--allowed-hosts", nargs="*", default=[],
                        help="more host names the editor answers to (e.g. the machine's name when "
                             "binding to 0.0.0.0); '*' for any")
    parser.add_argument("--time-budget", type=float, default=120.0,
                        help="seconds per request, queueing included (default 120)")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    return parser.parse_args(argv)


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def weight_format(weights: str) -> str:
    """The weight format that ``weights`` names (``auto``: :func:`auto_weights`); an unknown name
    raises ValueError."""
    if weights not in WEIGHT_FORMATS:
        raise ValueError(f"weights={weights!r}: expected one of {', '.join(WEIGHT_FORMATS)}")
    return auto_weights() if weights == "auto" else weights


def auto_weights() -> str:
    """bfloat16 where the CPU multiplies bfloat16 natively (:func:`ctrlg.lm.bf16_weights.native_bf16`),
    else int8."""
    return "bfloat16" if native_bf16() else "int8"


def load_editor(model_name=None, adapter: str | None = DEFAULT_ADAPTER, hmm_name: str | None = DEFAULT_HMM,
                weights: str = DEFAULT_WEIGHTS):
    """(model, tokenizer, HMM or None, prompt header, description) for the editor's settings;
    ``weights``: one of :data:`WEIGHT_FORMATS`."""
    adapter = None if adapter is None or str(adapter).lower() == "none" else adapter
    weights = weight_format(weights)
    model = load_model(model_name, adapter=adapter, int8_weights=weights == "int8",
                       bf16_weights=weights == "bfloat16")
    tokenizer = load_tokenizer(model_name)
    model.eval()
    header = ""
    if adapter is not None and adapter_info(adapter).get("prompt_style") == "story_continuation":
        header = continuation_prompt("", tokenizer, adapter_info(adapter).get("bos_token"))
    if hmm_name is None or str(hmm_name).lower() == "none":
        hmm = None
    elif hmm_name in EMBEDDED_HMMS:
        hmm = load_embedded_hmm(hmm_name, tokenizer=tokenizer)
    else:
        hmm = HMM.load(Path(hmm_name), tokenizer=tokenizer)
    description = (model_name or "SmolLM2-135M-Instruct (embedded)") + \
        (f" + adapter {adapter}" if adapter else "") + (f", {weights} weights" if weights != "float32" else "") + \
        (f", HMM {hmm_name}" if hmm is not None else "")
    return model, tokenizer, hmm, header, description


def main(argv=None) -> None:
    args = parse_args(argv)
    compute = ComputeThread(args.threads)   # loads the LM and runs every model call (ctrlg.app.compute)
    if not _is_loopback(args.host):
        print(f"warning: binding to {args.host}: anyone who can reach this address can use the "
              "editor (there is no authentication)", file=sys.stderr)
    print("loading the LM and the HMM ...", file=sys.stderr)
    model, tokenizer, hmm, header, description = compute.run(load_editor, args.model, args.adapter,
                                                             args.hmm, args.weights)
    allowed = (*LOOPBACK_HOSTS, args.host, *args.allowed_hosts)
    app = create_app(model, tokenizer, hmm, limits=Limits(time_budget_s=args.time_budget),
                     model_name=description, prompt_header=header, allowed_hosts=allowed,
                     compute=compute)
    print(f"ctrlg editor: http://{args.host}:{args.port}/", file=sys.stderr)
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
