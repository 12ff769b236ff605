"""Former home of :mod:`ctrlg.guide.canonical_masks` (the guide's modules now live in :mod:`ctrlg.guide`);
kept so that ``from ctrlg.canonical_masks import ...`` keeps working."""

from ctrlg.guide.canonical_masks import CanonicalFeasibility, restrict_to_mask  # noqa: F401

__all__ = [
    "CanonicalFeasibility",
    "restrict_to_mask",
]
