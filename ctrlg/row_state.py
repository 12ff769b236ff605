"""Former home of :mod:`ctrlg.guide.row_state` (the guide's modules now live in :mod:`ctrlg.guide`);
kept so that ``from ctrlg.row_state import ...`` keeps working."""

from ctrlg.guide.row_state import RowStates  # noqa: F401

__all__ = [
    "RowStates",
]
