"""Adapt an LM to CommonGen with LoRA: ``python -m experiments.adapt [overrides]``.

Trains LoRA factors on CommonGen train sentences (``form=unsupervised``, GeLaTo's setting) or
concept → sentence pairs (``form=supervised``), measures the held-out NLL of dev references
before and after, and saves the adapter (see configs/adapt.yaml and
:func:`ctrlg.tasks.commongen.adaptation.adapt`).
"""

import json

import hydra
from omegaconf import DictConfig, OmegaConf

from experiments.common import report_errors


@hydra.main(config_path="../configs", config_name="adapt", version_base=None)
@report_errors
def main(cfg: DictConfig) -> dict:
    from ctrlg.tasks.commongen.adaptation import adapt

    metrics = adapt(OmegaConf.to_container(cfg, resolve=True))
    print(json.dumps(metrics, indent=2))
    return metrics


if __name__ == "__main__":
    main()
