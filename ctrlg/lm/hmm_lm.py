"""An HMM dressed as a transformers causal LM: next-token logits are log p_hmm(next | generated).

``HMMForCausalLM`` wraps a :class:`ctrlg.HMM`. Like the Ctrl-G guide, it ignores the first
``prompt_length`` tokens of every row and conditions only on the tokens after them: at position j
(0-based) the logits are

    log p_hmm(x_{j+1} = v | x_{P}, ..., x_{j}) = log (p_j B)[v],   P = prompt_length,

where p_j is the forward message (filtering, then one transition step; p = π before any generated
token). Positions before P − 1 get log (π B) too, so logits are always finite.

Because its next-token distribution *is* the HMM's, sampling from it through
``ConstraintLogitsProcessor`` must draw exactly from p_hmm(x | α) — the exactness test of record.
It is also a cheap stand-in LM for tests. It has no KV cache (``use_cache=False``): every call runs
the forward algorithm over the sequence, O(T·h²).
"""

from __future__ import annotations

import torch
from transformers import GenerationConfig, GenerationMixin, PretrainedConfig, PreTrainedModel
from transformers.modeling_outputs import CausalLMOutput

from ctrlg.errors import VocabularyMismatchError

__all__ = ["HMMLMConfig", "HMMForCausalLM"]


class HMMLMConfig(PretrainedConfig):
    """Configuration of :class:`HMMForCausalLM`: number of hidden states, vocabulary, prompt length."""

    model_type = "ctrlg_hmm_lm"

    def __init__(self, num_hidden_states: int = 2, vocab_size: int = 2, prompt_length: int = 1,
                 eos_token_id=None, pad_token_id: int | None = None, bos_token_id: int | None = None,
                 **kwargs):
        self.eos_token_id, self.pad_token_id, self.bos_token_id = eos_token_id, pad_token_id, bos_token_id
        self.num_hidden_states = int(num_hidden_states)
        self.vocab_size = int(vocab_size)
        self.prompt_length = int(prompt_length)
        kwargs.setdefault("use_cache", False)
        kwargs.setdefault("tie_word_embeddings", False)
        super().__init__(**kwargs)


class HMMForCausalLM(PreTrainedModel, GenerationMixin):
    """A causal LM whose next-token distribution is an HMM's (see module docstring).

    Build with :meth:`from_hmm`; set :attr:`prompt_length` (or pass it to ``from_hmm``) to the
    padded prompt width of the ``input_ids`` you give ``generate``.
    """

    config_class = HMMLMConfig
    main_input_name = "input_ids"
    _supports_cache_class = False

    def __init__(self, config: HMMLMConfig):
        super().__init__(config)
        h, V = config.num_hidden_states, config.vocab_size
        frozen = lambda t: torch.nn.Parameter(t, requires_grad=False)  # noqa: E731
        self.initial = frozen(torch.full((h,), 1.0 / h))
        self.transition = frozen(torch.full((h, h), 1.0 / h))
        self.emission = frozen(torch.full((h, V), 1.0 / V))
        self.generation_config = GenerationConfig(use_cache=False, bos_token_id=config.bos_token_id,
                                                  eos_token_id=config.eos_token_id,
                                                  pad_token_id=config.pad_token_id)

    def _init_weights(self, module):  # parameters come from the HMM, never random
        return

    @classmethod
    def from_hmm(cls, hmm, *, prompt_length: int = 1, eos_token_id=None,
                 pad_token_id: int | None = None) -> "HMMForCausalLM":
        """Wrap ``hmm``; ``pad_token_id`` defaults to the (first) EOS id, else 0."""
        if pad_token_id is None:
            first_eos = eos_token_id[0] if isinstance(eos_token_id, (list, tuple)) else eos_token_id
            pad_token_id = 0 if first_eos is None else int(first_eos)
        config = HMMLMConfig(num_hidden_states=hmm.hidden_size, vocab_size=hmm.vocab_size,
                             prompt_length=prompt_length, eos_token_id=eos_token_id,
                             pad_token_id=pad_token_id)
        model = cls(config)
        with torch.no_grad():
            model.initial.copy_(hmm.initial)
            model.transition.copy_(hmm.transition)
            model.emission.copy_(hmm.emission)
        return model.to(hmm.emission.device).eval()

    @property
    def prompt_length(self) -> int:
        return self.config.prompt_length

    @prompt_length.setter
    def prompt_length(self, value: int) -> None:
        self.config.prompt_length = int(value)

    def get_input_embeddings(self):
        return None

    def prepare_inputs_for_generation(self, input_ids, attention_mask=None, **kwargs):
        return {"input_ids": input_ids, "attention_mask": attention_mask}

    @torch.no_grad()
    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                labels=None, return_dict: bool | None = None, **kwargs) -> CausalLMOutput:
        if input_ids.numel() and (input_ids.min() < 0 or input_ids.max() >= self.config.vocab_size):
            raise VocabularyMismatchError(
                f"input_ids must lie in [0, {self.config.vocab_size}) for this HMM LM; got range "
                f"[{int(input_ids.min())}, {int(input_ids.max())}]")
        Bsz, T = input_ids.shape
        P = self.config.prompt_length
        A, Bm = self.transition, self.emission
        prior = self.initial.expand(Bsz, -1)
        log_prior_logits = torch.log(prior @ Bm)
        logits = log_prior_logits[:, None, :].repeat(1, T, 1)
        p = prior
        for j in range(max(P, 0), T):
            q = p * Bm[:, input_ids[:, j]].T
            norm = q.sum(-1, keepdim=True)
            q = torch.where(norm > 0, q / norm.clamp_min(torch.finfo(q.dtype).tiny), p)
            p = q @ A
            logits[:, j] = torch.log(p @ Bm)
        return CausalLMOutput(logits=logits)
