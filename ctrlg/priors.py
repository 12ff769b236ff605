"""Former home of :mod:`ctrlg.guide.priors` (the guide's modules now live in :mod:`ctrlg.guide`);
kept so that ``from ctrlg.priors import ...`` keeps working."""

from ctrlg.guide.priors import PriorSource, HMMFilterPrior, HeadPrior  # noqa: F401

__all__ = [
    "PriorSource",
    "HMMFilterPrior",
    "HeadPrior",
]
