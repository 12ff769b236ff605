"""Hidden Markov models: the model, EM (Baum-Welch), latent-variable-distillation init, LM
sampling for distillation, and the embedded default HMM.

May import: :mod:`ctrlg.lm` (loading the LM to distil), :mod:`ctrlg.data` (prompts and corpora to
sample from), :mod:`ctrlg.kernels`, :mod:`ctrlg.checkpoint`, :mod:`ctrlg.vocab`,
:mod:`ctrlg.validation`, :mod:`ctrlg.errors`. Not the guide, the sampler or a task.
"""

from pathlib import Path

from ctrlg.errors import CheckpointError
from ctrlg.hmm.model import HMM, tokenizer_fingerprint
from ctrlg.hmm.prior_head import PriorHead

__all__ = ["HMM", "PriorHead", "tokenizer_fingerprint", "default_hmm_path", "load_default_hmm",
           "EMBEDDED_HMMS", "embedded_hmm_path", "load_embedded_hmm", "EMBEDDED_PRIOR_HEADS",
           "prior_head_path"]

DEFAULT_HMM_NAME = "hmm_smollm2_commongen"
# name -> folder under ctrlg/assets: the HMM of each pipeline (docs/models.md)
EMBEDDED_HMMS = {
    "instruct": DEFAULT_HMM_NAME,                         # SmolLM2-135M-Instruct, instruction prompts
    "commongen-adapted": "hmm_smollm2_commongen_adapted",  # the CommonGen-adapted LM, BOS prompt
    # not shipped (used by no default; re-create them with their commands in docs/models.md):
    # the same LM, 5x the samples, h = 512 (distilled on a GPU)
    "commongen-adapted-h512": "hmm_smollm2_commongen_adapted_h512",
    # h = 2,048 from 1M samples, distilled on one GPU (configs/distill_adapted_gpu.yaml); topk8-4096 storage
    "commongen-adapted-h2048": "hmm_smollm2_commongen_adapted_h2048",
    # the LM adapted on the human-written train captions only (adapter commongen-human): the
    # h = 512 HMM above re-fitted by EM to its samples (configs/distill_human.yaml); topk8-4096
    "commongen-human-h512": "hmm_smollm2_commongen_human_h512",
    # the story tasks' HMM (configs/distill_stories.yaml): the `stories` LM's unconditional
    # samples; guides infilling, interactive editing and the editor
    "stories-h512": "hmm_smollm2_stories_h512",
    # the editing HMM (configs/distill_stories_continue.yaml): the `stories-continue` LM's samples
    # under its prompt over prefixes of the training passages; guides editing and the editor
    "stories-continue-h512": "hmm_smollm2_stories_continue_h512",
}
# name -> folder under ctrlg/assets: prior heads saved apart from their HMM (HMM.attach_prior_head)
EMBEDDED_PRIOR_HEADS = {
    # reads the supervised CommonGen LM's prompt ("Concepts: a, b, c.") for the commongen-adapted HMM
    "commongen-supervised": "prior_head_smollm2_commongen_supervised",
}


def default_hmm_path() -> Path:
    """Directory of the embedded HMM checkpoint and its prior head (h = 256, distilled from
    SmolLM2-135M-Instruct on CommonGen-style prompts; see docs/hmm.md for how it was made)."""
    return Path(__file__).resolve().parent.parent / "assets" / DEFAULT_HMM_NAME


def load_default_hmm(*, tokenizer=None, device="cpu") -> HMM:
    """The embedded HMM (:func:`default_hmm_path`) with its LM-conditioned prior head as
    ``hmm.prior_head`` (None if the asset has none); with ``tokenizer``, checks both match."""
    return HMM.load(default_hmm_path(), tokenizer=tokenizer, device=device)


def embedded_hmm_path(name: str) -> Path:
    """Directory of the embedded HMM ``name`` (:data:`EMBEDDED_HMMS`); a registered HMM that is
    not in ``ctrlg/assets`` (not shipped, or not made yet) is an error that says how to make it."""
    if name not in EMBEDDED_HMMS:
        raise CheckpointError(f"unknown embedded HMM {name!r}; choose one of {sorted(EMBEDDED_HMMS)} "
                              "or give a checkpoint folder (hmm.path=...)")
    folder = Path(__file__).resolve().parent.parent / "assets" / EMBEDDED_HMMS[name]
    if not folder.is_dir():
        raise CheckpointError(f"the embedded HMM {name!r} is not in {folder}: it is not shipped; "
                              "re-create it with its command in docs/models.md (it writes the "
                              "folder), or give a checkpoint folder (hmm.path=...)")
    return folder


def load_embedded_hmm(name: str, *, tokenizer=None, device="cpu") -> HMM:
    """The embedded HMM ``name`` (with its prior head when it has one); with ``tokenizer``,
    checks both match."""
    return HMM.load(embedded_hmm_path(name), tokenizer=tokenizer, device=device)


def prior_head_path(name_or_folder: str) -> Path:
    """The folder of a prior head: an embedded one's name (:data:`EMBEDDED_PRIOR_HEADS`) or a
    folder written by ``PriorHead.save``."""
    if name_or_folder in EMBEDDED_PRIOR_HEADS:
        return Path(__file__).resolve().parent.parent / "assets" / EMBEDDED_PRIOR_HEADS[name_or_folder]
    folder = Path(name_or_folder)
    if not folder.is_dir():
        raise CheckpointError(f"no prior head {name_or_folder!r}: neither an embedded head "
                              f"({sorted(EMBEDDED_PRIOR_HEADS)}) nor a folder")
    return folder
