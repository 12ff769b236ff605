"""Data-parallel EM on ``torch.distributed``: every process runs the E-step on its shard of each
mini-batch and the expected counts are summed with ``all_reduce`` before the (identical) M-step
in every process, so P processes compute the single-process update (up to float summation order).

Run under torchrun (gloo on CPU, nccl on CUDA)::

    torchrun --nproc_per_node 2 -m ctrlg.hmm.distributed \\
        --init outputs/distill/h128/hmm --samples outputs/distill_samples/.../train \\
        --heldout outputs/distill_samples/.../heldout --out outputs/distill/h128_em \\
        --schedule 4:1,4:2,8:8 --num-chunks 8 --pseudocount 1.0

``--init`` is an HMM checkpoint (e.g. the LVD initialisation); rank 0 writes the result.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import torch
import torch.distributed as dist

from ctrlg.hmm.em import EMHistory, ExpectedCounts, baum_welch
from ctrlg.hmm.model import HMM
from ctrlg.hmm.sampling import load_chunks

__all__ = ["allreduce_counts", "distributed_baum_welch", "main"]


def allreduce_counts(counts: ExpectedCounts) -> None:
    """Sum every tensor of ``counts`` over the default process group, in place."""
    for tensor in counts.tensors():
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)


def distributed_baum_welch(hmm: HMM, train_tokens: torch.Tensor, **kwargs) -> tuple[HMM, EMHistory]:
    """:func:`ctrlg.hmm.em.baum_welch` with this process's shard and all-reduced counts. Every
    process passes the same ``train_tokens`` (or at least the same shape and seed); an initialised
    default process group is required."""
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError("distributed_baum_welch needs torch.distributed.init_process_group first")
    return baum_welch(hmm, train_tokens, reduce=allreduce_counts,
                      shard=(dist.get_rank(), dist.get_world_size()), **kwargs)


def main(argv: list[str] | None = None) -> None:

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--init", required=True, help="initial HMM checkpoint directory")
    parser.add_argument("--samples", required=True, help="training sample chunks directory")
    parser.add_argument("--heldout", default=None, help="held-out sample chunks directory")
    parser.add_argument("--out", required=True, help="output checkpoint directory (rank 0 writes)")
    parser.add_argument("--schedule", default="10:1")
    parser.add_argument("--num-chunks", type=int, default=1)
    parser.add_argument("--pseudocount", type=float, default=1.0)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--backend", default="torch", choices=["torch", "triton"])
    args = parser.parse_args(argv)

    use_cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if use_cuda else "gloo")
    device = torch.device(f"cuda:{int(os.environ.get('LOCAL_RANK', 0))}") if use_cuda else torch.device("cpu")
    try:
        hmm = HMM.load(args.init, device=device)
        train = load_chunks(args.samples)["tokens"]
        heldout = load_chunks(args.heldout)["tokens"] if args.heldout else None
        hmm, history = distributed_baum_welch(
            hmm, train, schedule=args.schedule, num_chunks=args.num_chunks,
            pseudocount=args.pseudocount, heldout_tokens=heldout, batch_size=args.batch_size,
            backend=args.backend, seed=args.seed)
        if dist.get_rank() == 0:
            out = hmm.cpu().save(args.out)
            (Path(out) / "curve.json").write_text(json.dumps(history.as_dict(), indent=2))
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
