"""The configured CommonGen methods and the checks of a run's configuration.

A method is a named entry of ``method_specs``: ``guide`` (none | logical | ctrlg), ``prior``
(filter: the HMM's forward posterior over the generated tokens; head: the LM-conditioned prior
saved with the HMM, :class:`ctrlg.guide.priors.HeadPrior`) and ``strength`` w (p_lm ·
p_hmm(α | x≤t, v)^w; w = 0 is logical masking). :func:`generation_settings` is a run's identity:
the settings a resumed or merged run must agree on.

May import: the library below :mod:`ctrlg.tasks` and :mod:`ctrlg.tasks.records` / :mod:`ctrlg.tasks.config`; within
this package, :mod:`~ctrlg.tasks.commongen.rerank` (the rerank rule is part of the config).
"""

from __future__ import annotations

import math

from omegaconf import DictConfig, OmegaConf

from ctrlg.errors import ExperimentConfigError
from ctrlg.tasks.commongen.rerank import rerank_rule, rerank_settings
from ctrlg.tasks.config import generation_config
from ctrlg.tasks.search_options import SearchOptions

__all__ = ["GUIDES", "PRIORS", "GENERATION_KEYS", "COMPUTE_ONLY_KEYS", "DEFAULT_VALUED_KEYS", "without_compute_settings", "method_spec", "check_config", "guide_kernel", "generation_settings", "widening",
           "CANDIDATE_POOLS", "candidate_pool"]

GUIDES = ("none", "logical", "ctrlg")

PRIORS = ("filter", "head")

CANDIDATE_POOLS = ("beams", "ended")


# the configuration keys that decide the generations: a resumed run must agree on all of them
GENERATION_KEYS = ("seed", "methods", "method_specs", "generation", "model", "hmm", "data",
                   "constraint", "rerank", "batch_size")


# sub-keys of those that say how the generations are computed, not what they are (left out of a
# run's identity: a GPU run resumes and merges with a CPU one)
COMPUTE_ONLY_KEYS = {"generation": ("guide_kernel", "fast_search", "score_kept_only")}
# sub-keys left out of a run's identity while at these values (runs from before they existed match)
DEFAULT_VALUED_KEYS = {"generation": {"beam_score": "guided", "sibling_penalty": 0.0,
                                      "widen_below_loglik": None, "widen_factor": 2,
                                      "candidate_pool": "beams"}}


def without_compute_settings(key: str, value):
    """``value`` of the setting ``key`` without its :data:`COMPUTE_ONLY_KEYS` sub-keys and its
    :data:`DEFAULT_VALUED_KEYS` sub-keys at their defaults."""
    dropped = COMPUTE_ONLY_KEYS.get(key, ())
    defaults = DEFAULT_VALUED_KEYS.get(key, {})
    if (dropped or defaults) and isinstance(value, dict):
        return {k: v for k, v in value.items()
                if k not in dropped and not (k in defaults and v == defaults[k])}
    return value


def method_spec(cfg: DictConfig, name: str) -> dict:
    """The spec of method ``name`` (``method_specs.<name>``), checked."""
    specs = cfg.get("method_specs") or {}
    if name not in specs:
        raise ExperimentConfigError(f"unknown method {name!r}; define it under method_specs or "
                                    f"choose from {sorted(specs)}")
    spec = {"guide": "ctrlg", "prior": "filter", "strength": 1.0,
            **OmegaConf.to_container(specs[name], resolve=True)}
    if spec["guide"] not in GUIDES:
        raise ExperimentConfigError(f"method_specs.{name}.guide must be one of {GUIDES}, got "
                                    f"{spec['guide']!r}")
    if spec["guide"] == "ctrlg":
        if spec["prior"] not in PRIORS:
            raise ExperimentConfigError(f"method_specs.{name}.prior must be one of {PRIORS}, "
                                        f"got {spec['prior']!r}")
        strength = spec["strength"]
        if not isinstance(strength, (int, float)) or not math.isfinite(strength) or strength < 0:
            raise ExperimentConfigError(f"method_specs.{name}.strength must be a finite number "
                                        f"≥ 0, got {strength!r}")
    return spec


def check_config(cfg: DictConfig) -> dict[str, dict]:
    """Validate the sizes and methods before anything is loaded; returns ``{method: spec}``."""
    gen = cfg.generation
    # num_beams first: a pipeline may set num_samples to ${generation.num_beams}
    for key, value in (("generation.num_beams", gen.get("num_beams", 1)),
                       ("generation.num_samples", gen.num_samples),
                       ("generation.max_new_tokens", gen.max_new_tokens),
                       ("batch_size", cfg.batch_size)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ExperimentConfigError(f"{key} must be a positive integer, got {value!r}")
    limit, offset = cfg.data.get("limit"), cfg.data.get("offset", 0)
    if limit is not None and (not isinstance(limit, int) or limit < 1):
        raise ExperimentConfigError(f"data.limit must be a positive integer or null (all items), "
                                    f"got {limit!r}")
    if not isinstance(offset, int) or offset < 0:
        raise ExperimentConfigError(f"data.offset must be an integer ≥ 0, got {offset!r}")
    if not cfg.methods:
        raise ExperimentConfigError("methods is empty; e.g. methods=[logical,ctrlg]")
    check_sampling(gen)
    rerank_rule(cfg)
    SearchOptions.from_config(gen, int(gen.get("num_beams", 1)), int(gen.num_samples))
    specs = {name: method_spec(cfg, name) for name in cfg.methods}
    for spec in specs.values():
        widening(spec, cfg)
    candidate_pool(cfg)
    return specs


def candidate_pool(cfg) -> str:
    """``generation.candidate_pool`` checked: ``beams`` (default) or ``ended``, the latter only
    with beam search and a rerank (its hypotheses' log-likelihoods come from the search)."""
    pool = str(cfg.generation.get("candidate_pool", "beams"))
    if pool not in CANDIDATE_POOLS:
        raise ExperimentConfigError(f"generation.candidate_pool must be one of {CANDIDATE_POOLS}, "
                                    f"got {pool!r}")
    if pool == "ended" and (int(cfg.generation.get("num_beams", 1)) <= 1
                            or rerank_rule(cfg)["rerank"] == "none"
                            or str(cfg.get("rerank_pass", "recorded")) == "full"):
        raise ExperimentConfigError("generation.candidate_pool=ended needs beam search "
                                    "(generation.num_beams > 1), a rerank (rerank != none) and "
                                    "the log-likelihoods recorded during the search "
                                    "(rerank_pass=recorded)")
    return pool


def widening(spec: dict, cfg) -> tuple[float, int] | None:
    """(τ, W) when the items of this method whose best satisfying candidate has
    log p_lm(y | prompt) < τ (the LM-likelihood rerank's pick, whatever rule then chooses) are
    searched again with W = f × the search's width beams (``generation.widen_below_loglik`` τ,
    null: off; ``generation.widen_factor`` f ≥ 2), else None. Iterative widening applies to Ctrl-G-guided
    beam search ranked by the LM likelihood: a kept beam far below the usual likelihood is one
    whose narrow search followed a fluent-looking prefix the HMM could not judge and then had to
    force the missing concepts in; the wider search adds candidates and the rerank's own rule
    picks among all of them, so under ``lm_loglik`` it never keeps a lower-scoring output; with
    ``mbr`` or a judge the same union is re-picked by that rule (so re-picking saved candidates
    still equals decoding with the other rule). Logical masking is not
    widened: its outputs are long by construction and fall below any τ that singles out the
    guided search's failures, so it would be searched twice on nearly every item."""
    gen = cfg.generation
    threshold = gen.get("widen_below_loglik")
    if threshold is None or spec.get("guide") != "ctrlg":
        return None
    if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) \
            or not math.isfinite(threshold):
        raise ExperimentConfigError(f"generation.widen_below_loglik must be a finite log-likelihood "
                                    f"or null, got {threshold!r}")
    beams = int(gen.get("num_beams", 1))
    factor = gen.get("widen_factor", 2)
    if beams <= 1:
        raise ExperimentConfigError("generation.widen_below_loglik needs beam search "
                                    "(generation.num_beams > 1)")
    if isinstance(factor, bool) or not isinstance(factor, int) or factor < 2:
        raise ExperimentConfigError(f"generation.widen_factor must be an integer ≥ 2, got {factor!r}")
    width = factor * max(beams, int(gen.num_samples))
    if rerank_rule(cfg)["rerank"] == "none":
        raise ExperimentConfigError("generation.widen_below_loglik needs the candidates' "
                                    "log-likelihoods (rerank=lm_loglik or mbr); set it to null "
                                    "with rerank=none")
    return float(threshold), width


def check_sampling(gen: DictConfig) -> None:
    """Ancestral sampling (``generation.num_beams=1``) needs temperature > 0 and top_p in
    (0, 1]; transformers would refuse them only after the LM is loaded. Beam search ignores both."""
    if int(gen.get("num_beams", 1)) != 1:
        return
    temperature, top_p = gen.get("temperature", 1.0), gen.get("top_p", 1.0)
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) \
            or not 0 < temperature < float("inf"):
        raise ExperimentConfigError(
            f"generation.temperature must be a number > 0 when sampling (generation.num_beams=1), "
            f"got {temperature!r}; for deterministic decoding use beam search instead "
            f"(generation.num_beams=B > 1, e.g. generation.num_beams=4 generation.num_samples=4), "
            f"or a small temperature such as 0.1")
    if isinstance(top_p, bool) or not isinstance(top_p, (int, float)) or not 0 < top_p <= 1:
        raise ExperimentConfigError(f"generation.top_p must be in (0, 1] when sampling, got "
                                    f"{top_p!r}; 1.0 turns nucleus sampling off")


def guide_kernel(gen) -> bool | None:
    """``generation.guide_kernel``: auto (None: the library's default, the torch recurrence on
    every device), true (the Triton backward-table kernel) or false (:class:`ctrlg.sampler.ConstraintLogitsProcessor`'s
    ``use_kernel``); the two agree up to float32 rounding (tests/test_kernel_backward.py)."""
    value = gen.get("guide_kernel", "auto")
    if value in (None, "auto"):
        return None
    if isinstance(value, bool):
        return value
    raise ExperimentConfigError(f"generation.guide_kernel must be auto, true or false; got {value!r}")


def generation_settings(cfg: DictConfig) -> dict:
    """The settings that decide the generations (only the specs of the methods in use; the
    rerank's further settings only when not at their defaults: :func:`rerank_settings`)."""
    out = {key: without_compute_settings(key, value)
           for key, value in generation_config(cfg, GENERATION_KEYS).items()}
    out.update(rerank_settings(cfg))
    specs = out.get("method_specs") or {}
    out["method_specs"] = {m: specs.get(m) for m in out.get("methods") or []}
    return out
