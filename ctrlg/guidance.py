"""Former home of :mod:`ctrlg.guide.guidance` (the guide's modules now live in :mod:`ctrlg.guide`);
kept so that ``from ctrlg.guidance import ...`` keeps working."""

from ctrlg.guide.guidance import (guidance_log_ratio, apply_guidance, guided_log_probs,  # noqa: F401
                                  lookahead_scores, log_prob_accept_rows)

__all__ = [
    "guidance_log_ratio",
    "apply_guidance",
    "guided_log_probs",
    "lookahead_scores",
    "log_prob_accept_rows",
]
