"""Training the LM-conditioned prior (:class:`ctrlg.hmm.prior_head.PriorHead`) on distillation
samples, with the HMM frozen, and the held-out prefix log-likelihood table.

For a sampled sequence x_1..x_L (EOS-padded) and each prefix length k (0 ≤ k < L), the head reads
the LM feature f_k from which x_{k+1} was sampled (``hidden[:, k]`` of :mod:`ctrlg.hmm.sampling`;
f_0 is the prompt's last position) and gives q_k(z) over the hidden state of x_{k+1}. The loss is
the HMM's negative log-likelihood of the continuation under that prior::

    loss_k = −log Σ_z q_k(z) · b_{k+1}(z),   b_s(z) = P_hmm(x_s..x_L | z_s = z)

with b from the backward recursion b_L(z) = B[z, x_L], b_s(z) = B[z, x_s] · Σ_z' A[z, z'] b_{s+1}(z')
(run in log space: O(N · L · h²) once, since the HMM is frozen). Replacing q_k by the HMM's own
filtering prior P(z_{k+1} | x_1..x_k) turns loss_k into −log P_hmm(x_{k+1..L} | x_1..x_k), so the
head is trained on exactly the quantity the guide uses it for. Positions after a row's first EOS
have no stored feature (the row stopped sampling) and are skipped.

Training: Adam on mini-batches of (f_k, log b_{k+1}) pairs, a held-out split of the training
*sequences* for early stopping (best epoch kept), seeded. Cost per epoch O(M · (d·m + m·h + d·h))
for M positions.
"""

from __future__ import annotations

import math
from typing import Sequence

import torch
from tqdm.auto import tqdm

from ctrlg.errors import CtrlgError
from ctrlg.hmm.model import HMM
from ctrlg.hmm.prior_head import PriorHead

__all__ = [
    "log_continuation_likelihoods",
    "log_filtering_priors",
    "feature_positions",
    "prior_head_loss",
    "train_prior_head",
    "prefix_loglik_table",
]


@torch.no_grad()
def log_continuation_likelihoods(hmm: HMM, tokens: torch.Tensor, *, batch_size: int = 1024) -> torch.Tensor:
    """log b_s(z) = log P_hmm(x_s..x_L | z_s = z) for every row and s: float32 [N, L, h]
    (log-space backward recursion, module docstring)."""
    tokens = torch.as_tensor(tokens).long()
    N, L = tokens.shape
    log_emission_t = hmm.emission.clamp_min(0).log().T.contiguous()  # [V, h]
    transition_t = hmm.transition.T.contiguous()
    out = torch.empty(N, L, hmm.hidden_size, dtype=torch.float32)
    for s0 in range(0, N, batch_size):
        x = tokens[s0:s0 + batch_size]
        log_b = log_emission_t[x[:, L - 1]]
        out[s0:s0 + batch_size, L - 1] = log_b
        for s in range(L - 2, -1, -1):
            top = log_b.max(-1, keepdim=True).values.clamp_min(-1e30)
            log_b = log_emission_t[x[:, s]] + ((log_b - top).exp() @ transition_t).log() + top
            out[s0:s0 + batch_size, s] = log_b
    return out


@torch.no_grad()
def log_filtering_priors(hmm: HMM, tokens: torch.Tensor) -> torch.Tensor:
    """log P_hmm(z_{k+1} | x_1..x_k) for k = 0..L-1: float32 [N, L, h] (k = 0: log π); the prior
    the guide uses without a head (scaled forward recursion)."""
    tokens = torch.as_tensor(tokens).long()
    N, L = tokens.shape
    emission_t = hmm.emission.T
    out = torch.empty(N, L, hmm.hidden_size, dtype=torch.float32)
    prior = hmm.initial.expand(N, -1)
    for k in range(L):
        out[:, k] = prior.clamp_min(0).log()
        posterior = prior * emission_t[tokens[:, k]]
        posterior = posterior / posterior.sum(-1, keepdim=True).clamp_min(torch.finfo(torch.float32).tiny)
        prior = posterior @ hmm.transition
    return out


def feature_positions(tokens: torch.Tensor, eos_token_ids: Sequence[int]) -> torch.Tensor:
    """Bool [N, L]: positions k whose feature was stored (k ≤ the row's first EOS)."""
    tokens = torch.as_tensor(tokens)
    is_eos = torch.isin(tokens, torch.tensor(list(eos_token_ids), dtype=tokens.dtype))
    eos_before = torch.cumsum(is_eos.long(), 1) - is_eos.long()  # EOS strictly before k
    return eos_before == 0


def prior_head_loss(log_q: torch.Tensor, log_b: torch.Tensor) -> torch.Tensor:
    """Per position −log Σ_z q(z) · b(z) from log q and log b [..., h] (module docstring)."""
    return -torch.logsumexp(log_q + log_b, -1)


def _flatten(features, log_b, mask):
    return features[mask], log_b[mask]


def train_prior_head(hmm: HMM, features: torch.Tensor, tokens: torch.Tensor, *,
                     eos_token_ids: Sequence[int], inner_size: int = 256, valid_fraction: float = 0.05,
                     epochs: int = 30, patience: int = 3, lr: float = 1e-3, weight_decay: float = 0.0,
                     batch_size: int = 1024, seed: int = 0, config: dict | None = None,
                     progress: bool | None = None) -> tuple[PriorHead, dict]:
    """Fit a PriorHead to ``features`` [N, L, d] (LM feature at each prefix position) and ``tokens``
    [N, L] with ``hmm`` frozen. The last ``valid_fraction`` of the rows is held out for early
    stopping (the best epoch's weights are returned). Returns (head, history) where history has
    per-epoch ``train_loss`` and ``valid_loss`` (mean −log-likelihood of a continuation) and the
    ``valid_loss`` of the filtering prior and of the head's initial state for reference."""
    tokens = torch.as_tensor(tokens).long()
    N, L = tokens.shape
    if features.shape[:2] != (N, L):
        raise CtrlgError(f"features have shape {tuple(features.shape)} but tokens {tuple(tokens.shape)}; "
                         f"sample with return_hidden=True")
    n_valid = max(1, int(round(N * valid_fraction)))
    if n_valid >= N:
        raise CtrlgError(f"{N} sequences are too few to hold out {n_valid} for early stopping")
    generator = torch.Generator().manual_seed(int(seed))
    torch.manual_seed(int(seed))
    mask = feature_positions(tokens, eos_token_ids)
    log_b = log_continuation_likelihoods(hmm, tokens)
    train_f, train_b = _flatten(features[:-n_valid], log_b[:-n_valid], mask[:-n_valid])
    valid_f, valid_b = _flatten(features[-n_valid:], log_b[-n_valid:], mask[-n_valid:])
    filtering = log_filtering_priors(hmm, tokens[-n_valid:])[mask[-n_valid:]]
    del log_b

    head = PriorHead(features.shape[-1], hmm.hidden_size, inner_size=inner_size, config=config)
    # start from the average filtering prior (a feature-independent q)
    start_prior = log_filtering_priors(hmm, tokens[:-n_valid])[mask[:-n_valid]].exp().mean(0)
    head.init_bias(start_prior.clamp_min(1e-12).log())

    def evaluate() -> float:
        head.eval()
        with torch.no_grad():
            total = sum(float(prior_head_loss(head(valid_f[i:i + 8192].float()), valid_b[i:i + 8192]).sum())
                        for i in range(0, len(valid_f), 8192))
        return total / len(valid_f)

    history = {"train_loss": [], "valid_loss": [], "train_positions": len(train_f),
               "valid_positions": len(valid_f),
               "valid_loss_filtering_prior": float(prior_head_loss(filtering, valid_b).mean()),
               "valid_loss_initial": evaluate()}
    optimizer = torch.optim.Adam(head.parameters(), lr=lr, weight_decay=weight_decay)
    best, best_state, waited = math.inf, None, 0
    bar = tqdm(range(epochs), desc="prior head", disable=not progress if progress is not None else None)
    for _ in bar:
        head.train()
        order = torch.randperm(len(train_f), generator=generator)
        total = 0.0
        for i in range(0, len(order), batch_size):
            idx = order[i:i + batch_size]
            loss = prior_head_loss(head(train_f[idx].float()), train_b[idx]).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            total += float(loss.detach()) * len(idx)
        history["train_loss"].append(total / len(order))
        history["valid_loss"].append(evaluate())
        bar.set_postfix(valid=history["valid_loss"][-1])
        if history["valid_loss"][-1] < best - 1e-4:
            best, waited = history["valid_loss"][-1], 0
            best_state = {k: v.detach().clone() for k, v in head.state_dict().items()}
        else:
            waited += 1
            if waited >= patience:
                break
    if best_state is not None:
        head.load_state_dict(best_state)
    history["best_epoch"] = int(min(range(len(history["valid_loss"])), key=history["valid_loss"].__getitem__)) \
        if history["valid_loss"] else None
    return head.eval(), history


@torch.no_grad()
def prefix_loglik_table(hmm: HMM, head: PriorHead | None, tokens: torch.Tensor, features: torch.Tensor | None,
                        lm_logprob: torch.Tensor, log_unigram: torch.Tensor, *, eos_token_ids: Sequence[int],
                        prefix_lengths: Sequence[int] = (0, 4, 16)) -> list[dict]:
    """Held-out log-likelihood of the continuation x_{k+1..L} after k given tokens, per token, for
    each k in ``prefix_lengths``, over the rows still running at k (no EOS among x_1..x_k):

    - ``unigram``: Σ log u(x_s);  ``lm``: Σ log p_lm(x_s | prompt, x_<s) (stored at sampling);
    - ``hmm``: log P_hmm(x_{k+1..L} | x_1..x_k), filtering over the k tokens (k = 0: the HMM alone);
    - ``hmm_head``: log Σ_z q(z | f_k) · b_{k+1}(z), the head's prior at position k.

    Each figure is reported per continuation token (EOS padding included, as the HMM models it)
    and per real token (up to and including the first EOS)."""
    tokens = torch.as_tensor(tokens).long()
    N, L = tokens.shape
    mask = feature_positions(tokens, eos_token_ids)
    log_b = log_continuation_likelihoods(hmm, tokens)
    filtering = log_filtering_priors(hmm, tokens)
    real = feature_positions(tokens, eos_token_ids)  # x_s is real iff no EOS strictly before s
    rows = []
    for k in prefix_lengths:
        if not 0 <= k < L:
            raise CtrlgError(f"prefix length {k} must lie in [0, {L})")
        running = mask[:, k]
        n = int(running.sum())
        if n == 0:
            continue
        padded_tokens = n * (L - k)
        real_tokens = int(real[running, k:].sum())
        totals = {
            "unigram": float(log_unigram[tokens[running, k:]].double().sum()),
            "lm": float(lm_logprob[running, k:].double().sum()),
            "hmm": float(torch.logsumexp(filtering[running, k] + log_b[running, k], -1).double().sum()),
        }
        if head is not None and features is not None:
            log_q = head(features[running, k].float())
            totals["hmm_head"] = float(torch.logsumexp(log_q + log_b[running, k], -1).double().sum())
        rows.append({"prefix_length": k, "sequences": n, "tokens": padded_tokens, "real_tokens": real_tokens,
                     "per_token": {m: v / padded_tokens for m, v in totals.items()},
                     "per_real_token": {m: v / real_tokens for m, v in totals.items()}})
    return rows
