"""Former home of :mod:`ctrlg.guide.feasibility` (the guide's modules now live in :mod:`ctrlg.guide`);
kept so that ``from ctrlg.feasibility import ...`` keeps working."""

from ctrlg.guide.feasibility import Feasibility, as_token_list, renamed_budget  # noqa: F401

__all__ = [
    "Feasibility",
    "as_token_list",
    "renamed_budget",
]
