"""Data-parallel EM: two gloo processes on CPU give the parameters of one process."""

import json
import os
import subprocess
import sys

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from ctrlg import HMM
from ctrlg.hmm.em import baum_welch

SCHEDULE = [(2, 1), (3, 2)]


def problem():
    g = torch.Generator().manual_seed(0)
    make = lambda *shape: torch.rand(*shape, generator=g).add(0.01)  # noqa: E731
    true = HMM.from_params(make(3), make(3, 3), make(3, 7), normalize=True)
    init = HMM.from_params(make(3), make(3, 3), make(3, 7), normalize=True)
    return init, true.sample(37, 5, seed=1), true.sample(9, 5, seed=2)


def worker(rank, world, init_file, out_dir):
    from ctrlg.hmm.distributed import distributed_baum_welch

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        init, train, heldout = problem()
        hmm, history = distributed_baum_welch(init, train, schedule=SCHEDULE, num_chunks=2,
                                              pseudocount=0.1, heldout_tokens=heldout, seed=3)
        hmm.save(os.path.join(out_dir, f"rank{rank}"))
        with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as handle:
            json.dump(history.as_dict(), handle)
    finally:
        dist.destroy_process_group()


def test_two_gloo_processes_equal_one(tmp_path):
    if not dist.is_available():
        pytest.skip("torch.distributed is not available")
    mp.spawn(worker, args=(2, str(tmp_path / "init"), str(tmp_path)), nprocs=2, join=True)
    init, train, heldout = problem()
    single, history = baum_welch(init, train, schedule=SCHEDULE, num_chunks=2, pseudocount=0.1,
                                 heldout_tokens=heldout, seed=3)
    for rank in range(2):
        multi = HMM.load(tmp_path / f"rank{rank}")
        for name in ("initial", "transition", "emission"):
            torch.testing.assert_close(getattr(multi, name), getattr(single, name), atol=1e-6, rtol=1e-5)
        other = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert other["train_ll"][1:] == pytest.approx(history.train_ll[1:], rel=1e-6)


@pytest.mark.heavy
def test_torchrun_entry_point(tmp_path):
    """The module runs under torchrun (process start-up makes this slow, hence heavy)."""
    from safetensors.torch import save_file

    init, train, heldout = problem()
    init.save(tmp_path / "init")
    for name, tokens in (("train", train), ("heldout", heldout)):
        (tmp_path / name).mkdir()
        save_file({"tokens": tokens.to(torch.int32)}, str(tmp_path / name / "chunk_00000.safetensors"))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           "-m", "ctrlg.hmm.distributed", "--init", str(tmp_path / "init"), "--samples",
           str(tmp_path / "train"), "--heldout", str(tmp_path / "heldout"), "--out", str(tmp_path / "out"),
           "--schedule", "2:1,3:2", "--num-chunks", "2", "--pseudocount", "0.1", "--seed", "3"]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    subprocess.run(cmd, check=True, env=env, capture_output=True, timeout=300)
    single, _ = baum_welch(init, train, schedule=SCHEDULE, num_chunks=2, pseudocount=0.1, seed=3)
    multi = HMM.load(tmp_path / "out")
    torch.testing.assert_close(multi.emission, single.emission, atol=1e-6, rtol=1e-5)
    assert json.loads((tmp_path / "out" / "curve.json").read_text())["step"][-1] == 5
