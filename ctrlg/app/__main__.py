"""``python -m ctrlg.app [--host 127.0.0.1] [--port 8000] [--model NAME] [--hmm PATH]``

Serves the editor on the embedded SmolLM2-135M-Instruct and the embedded HMM (offline, CPU) by
default. ``--model`` takes what :func:`ctrlg.lm.models.load` takes (a local folder, a ``.gguf`` file,
a hub id); ``--hmm`` a checkpoint folder written by ``HMM.save`` (checked against the tokenizer),
or ``none`` for logical masking only. Binds to 127.0.0.1 unless ``--host`` says otherwise.
"""

from __future__ import annotations

import argparse
import ipaddress
import sys

import torch
import uvicorn

from ctrlg.app import Limits, create_app
from ctrlg.hmm import HMM, load_default_hmm
from ctrlg.lm.models import load_model, load_tokenizer


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m ctrlg.app", description=__doc__.split("\n\n")[1],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--host", default="127.0.0.1", help="interface to bind (default: loopback)")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--model", default=None, help="LM (default: the embedded SmolLM2-135M-Instruct)")
    parser.add_argument("--hmm", default=None,
                        help="HMM checkpoint folder (default: the embedded HMM); 'none' for logical masking only")
    parser.add_argument("--time-budget", type=float, default=120.0,
                        help="seconds per request, queueing included (default 120)")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    return parser.parse_args(argv)


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if not _is_loopback(args.host):
        print(f"warning: binding to {args.host}: anyone who can reach this address can use the "
              "editor (there is no authentication)", file=sys.stderr)
    print("loading the LM and the HMM ...", file=sys.stderr)
    model, tokenizer = load_model(args.model), load_tokenizer(args.model)
    if args.hmm is None:
        hmm = load_default_hmm(tokenizer=tokenizer)
    elif args.hmm.lower() == "none":
        hmm = None
    else:
        hmm = HMM.load(args.hmm, tokenizer=tokenizer)
    app = create_app(model, tokenizer, hmm, limits=Limits(time_budget_s=args.time_budget),
                     model_name=args.model or "SmolLM2-135M-Instruct (embedded)")
    print(f"ctrlg editor: http://{args.host}:{args.port}/", file=sys.stderr)
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
