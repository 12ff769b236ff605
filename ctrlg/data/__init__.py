"""Dataset readers (bundled offline copies, with the Hugging Face hub path kept for users) and the
ILM-style hierarchical masking used by the infilling experiment; the CommonGen prompt formats
(:mod:`ctrlg.data.commongen_prompts`) shared by distillation, adaptation and decoding; which
CommonGen train targets an LM is adapted on (:mod:`ctrlg.data.commongen_targets`).

May import: :mod:`ctrlg.dfa` (keyword matching for CommonGen+), :mod:`ctrlg.errors`. Nothing that
models text (lm, hmm, guide, sampler).
"""

from ctrlg.data._files import BUNDLED_DIR, DatasetError, bundled_path, read_jsonl
from ctrlg.data.commongen import (CommonGenExample, load_commongen, load_commongen_hub,
                                  parse_concept_set)
from ctrlg.data.infill_mask import (Granularity, MaskedDocument, MaskedSpan,
                                    calibrate_mask_probability, mask_document, mask_hierarchical,
                                    mask_ratio, parse_hierarchy)
from ctrlg.data.lambada import LambadaExample, load_lambada, load_lambada_passages

__all__ = [
    "BUNDLED_DIR", "DatasetError", "bundled_path", "read_jsonl",
    "CommonGenExample", "load_commongen", "load_commongen_hub", "parse_concept_set",
    "Granularity", "MaskedDocument", "MaskedSpan", "calibrate_mask_probability", "mask_document",
    "mask_hierarchical", "mask_ratio", "parse_hierarchy",
    "LambadaExample", "load_lambada", "load_lambada_passages",
]
