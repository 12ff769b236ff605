"""Former home of :mod:`ctrlg.guide.token_weights` (the guide's modules now live in :mod:`ctrlg.guide`);
kept so that ``from ctrlg.token_weights import ...`` keeps working."""

from ctrlg.guide.token_weights import (FOLD_MAX_GAIN, INLINE_ROWS, RATIO_FLOOR_GAP,  # noqa: F401
                                       UNDERFLOW_BOUND, TokenWeights, log_ratios)

__all__ = [
    "TokenWeights",
    "log_ratios",
    "RATIO_FLOOR_GAP",
    "INLINE_ROWS",
    "UNDERFLOW_BOUND",
    "FOLD_MAX_GAIN",
]
