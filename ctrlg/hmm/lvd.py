"""Latent-variable distillation (LVD) initialisation of an HMM (Liu et al. 2023; used by GeLaTo
and Ctrl-G).

1. Cluster the LM's last-layer hidden states ``h_{t-1}`` — the state from which each sampled
   token x_t was drawn (see :mod:`ctrlg.hmm.sampling`) — into ``h - 1`` clusters with k-means
   (k-means++ seeding on a subsample, then Lloyd iterations on all points).
2. Treat the cluster of each position as an observed hidden state z_t and estimate the HMM by
   counting, with a pseudocount (additive smoothing)::

       π_i ∝ #{z_1 = i} + c/h,   A_ij ∝ #{z_t = i, z_{t+1} = j} + c/h,
       B_iv ∝ #{z_t = i, x_t = v} + c·u_v

   (u: uniform, or the smoothed unigram of the tokens as in :mod:`ctrlg.hmm.em`)

3. EOS padding: the last state ``h - 1`` is a dedicated *EOS-padding state*: every position after
   a sequence's first EOS is assigned to it; it emits only EOS and transitions only to itself, so
   "after EOS, EOS forever" holds exactly, as in the sampler's EOS-padded data. Its rows are
   kept fixed by EM (``config["eos_pad_state"]``).
"""

from __future__ import annotations

import torch
from tqdm.auto import tqdm

from ctrlg.errors import CtrlgError
from ctrlg.hmm.em import emission_prior_mean
from ctrlg.hmm.model import HMM

__all__ = ["kmeans", "assign_clusters", "padding_mask", "count_hmm", "lvd_init"]


def _sq_dist(x: torch.Tensor, centroids: torch.Tensor, c_norm: torch.Tensor) -> torch.Tensor:
    return (x * x).sum(-1, keepdim=True) - 2 * x @ centroids.T + c_norm[None]


def assign_clusters(x: torch.Tensor, centroids: torch.Tensor, *, block: int = 16384) -> torch.Tensor:
    """Index of the nearest centroid (squared Euclidean) for each row of ``x`` [N, d], on
    ``x``'s device. Cost: O(N·k·d), in blocks of ``block`` rows."""
    centroids = centroids.to(x.device)
    c_norm = (centroids * centroids).sum(-1)
    out = torch.empty(x.shape[0], dtype=torch.long, device=x.device)
    for s in range(0, x.shape[0], block):
        xb = x[s:s + block].float()
        out[s:s + block] = _sq_dist(xb, centroids, c_norm).argmin(-1)
    return out


def kmeans(x: torch.Tensor, k: int, *, iters: int = 20, seed: int = 0, init_sample: int = 20000,
           progress: bool = False) -> torch.Tensor:
    """k-means (k-means++ seeding on ≤ ``init_sample`` points, then Lloyd) → centroids [k, d] on
    the CPU. The seeding runs on the CPU (one generator, the same centroids whatever the device);
    the Lloyd iterations run on ``x``'s device (a GPU makes LVD on millions of positions take
    seconds). Cost: O(iters · N·k·d)."""
    x = x.float()
    n = x.shape[0]
    if k <= 0 or k > n:
        raise CtrlgError(f"k-means needs 1 ≤ k ≤ number of points ({n}); got k={k}")
    g = torch.Generator().manual_seed(int(seed))
    sub = x[torch.randperm(n, generator=g)[:max(k, min(n, init_sample))].to(x.device)].cpu()
    centroids = torch.empty(k, x.shape[1])
    centroids[0] = sub[torch.randint(len(sub), (1,), generator=g)]
    closest = ((sub - centroids[0]) ** 2).sum(-1)
    for i in range(1, k):
        weights = closest.clamp_min(0)
        idx = (torch.multinomial(weights, 1, generator=g) if weights.sum() > 0
               else torch.randint(len(sub), (1,), generator=g))
        centroids[i] = sub[idx]
        closest = torch.minimum(closest, ((sub - centroids[i]) ** 2).sum(-1))
    centroids = centroids.to(x.device)
    for _ in tqdm(range(iters), desc="k-means", disable=not progress):
        labels = assign_clusters(x, centroids)
        sums = torch.zeros_like(centroids).index_add_(0, labels, x)
        counts = torch.bincount(labels, minlength=k).float()
        empty = counts == 0
        centroids = torch.where(empty[:, None], centroids, sums / counts.clamp_min(1)[:, None])
        if empty.any():  # re-seed empty clusters at random points
            centroids[empty] = x[torch.randint(n, (int(empty.sum()),), generator=g).to(x.device)]
    return centroids.cpu()


def padding_mask(tokens: torch.Tensor, eos_token_id: int) -> torch.Tensor:
    """Bool [N, L]: True at positions strictly after the first EOS of each row (the padding)."""
    is_eos = tokens == eos_token_id
    seen = is_eos.long().cumsum(-1)
    return (seen - is_eos.long()) > 0


def count_hmm(states: torch.Tensor, tokens: torch.Tensor, hidden_size: int, vocab_size: int, *,
              pseudocount: float = 1.0, eos_pad_state: int | None = None,
              eos_token_id: int | None = None, config: dict | None = None,
              emission_prior: torch.Tensor | None = None) -> HMM:
    """Maximum-a-posteriori HMM from observed state and token sequences [N, L] (module equation).
    With ``eos_pad_state``, that state's rows are set to "emit EOS, stay" exactly."""
    h, V = hidden_size, vocab_size
    if states.shape != tokens.shape or states.ndim != 2:
        raise CtrlgError(f"states and tokens must both be [N, L]; got {tuple(states.shape)} and "
                         f"{tuple(tokens.shape)}")
    if pseudocount <= 0:
        raise CtrlgError(f"pseudocount must be positive, got {pseudocount}")
    states, tokens = states.long(), tokens.long()
    initial = torch.bincount(states[:, 0], minlength=h).double() + pseudocount / h
    pair = (states[:, :-1] * h + states[:, 1:]).flatten()
    transition = torch.bincount(pair, minlength=h * h).double().view(h, h) + pseudocount / h
    emission = torch.zeros(h, V, dtype=torch.float64)
    emission.index_put_((states.flatten(), tokens.flatten()), torch.ones(states.numel(), dtype=torch.float64),
                        accumulate=True)
    emission += pseudocount * (1.0 / V if emission_prior is None else emission_prior.double()[None])
    if eos_pad_state is not None:
        if eos_token_id is None:
            raise CtrlgError("eos_pad_state needs eos_token_id")
        transition[eos_pad_state] = 0
        transition[eos_pad_state, eos_pad_state] = 1
        emission[eos_pad_state] = 0
        emission[eos_pad_state, eos_token_id] = 1
    config = dict(config or {})
    if eos_pad_state is not None:
        config.update(eos_pad_state=int(eos_pad_state), eos_token_id=int(eos_token_id))
    return HMM.from_params(initial, transition, emission, config=config, normalize=True)


def lvd_init(tokens: torch.Tensor, hidden: torch.Tensor, hidden_size: int, vocab_size: int, *,
             eos_token_id: int | None, pseudocount: float = 1.0, kmeans_iters: int = 20,
             seed: int = 0, config: dict | None = None, progress: bool = False,
             emission_prior: str = "uniform", device: str | torch.device = "cpu") -> HMM:
    """LVD initialisation (module docstring). ``tokens`` [N, L] EOS-padded samples, ``hidden``
    [N, L, d] the LM states they were sampled from. With ``eos_token_id``, state ``hidden_size-1``
    is the EOS-padding state and ``hidden_size-1`` clusters are fitted; without, all are clusters.
    ``device``: where the k-means iterations run (the counting stays on the CPU)."""
    if tokens.shape != hidden.shape[:2]:
        raise CtrlgError(f"tokens {tuple(tokens.shape)} and hidden {tuple(hidden.shape)} disagree")
    tokens = tokens.long()
    if eos_token_id is None:
        pad = torch.zeros_like(tokens, dtype=torch.bool)
        clusters = hidden_size
    else:
        pad = padding_mask(tokens, eos_token_id)
        clusters = hidden_size - 1
    features = hidden[~pad].to(device).float()
    if features.shape[0] < clusters:
        raise CtrlgError(f"{features.shape[0]} non-padding tokens cannot seed {clusters} clusters")
    centroids = kmeans(features, clusters, iters=kmeans_iters, seed=seed, progress=progress)
    states = torch.full(tokens.shape, hidden_size - 1, dtype=torch.long)
    states[~pad] = assign_clusters(features, centroids).cpu()
    del features
    prior = emission_prior_mean(emission_prior, tokens, vocab_size, "cpu")
    return count_hmm(states, tokens, hidden_size, vocab_size, pseudocount=pseudocount,
                     emission_prior=prior,
                     eos_pad_state=None if eos_token_id is None else hidden_size - 1,
                     eos_token_id=eos_token_id, config=config)
