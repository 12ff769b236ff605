"""Adapt an LM with LoRA: ``python -m experiments.adapt [overrides]``.

``task=commongen`` (default, configs/adapt.yaml): CommonGen train sentences (``form=unsupervised``,
GeLaTo's setting) or concept → sentence pairs (``form=supervised``),
:func:`ctrlg.tasks.commongen.adaptation.adapt`. ``--config-name adapt_stories``: the story tasks'
LMs (``form=plain|continuation|ilm``), :func:`ctrlg.tasks.stories.adaptation.adapt`. Measures the
held-out NLL before and after and saves the adapter.
"""

import json

import hydra
from omegaconf import DictConfig, OmegaConf

from experiments.common import report_errors


@hydra.main(config_path="../configs", config_name="adapt", version_base=None)
@report_errors
def main(cfg: DictConfig) -> dict:
    config = OmegaConf.to_container(cfg, resolve=True)
    if config.get("task", "commongen") == "stories":
        from ctrlg.tasks.stories.adaptation import adapt
    else:
        from ctrlg.tasks.commongen.adaptation import adapt
    metrics = adapt(config)
    print(json.dumps(metrics, indent=2))
    return metrics


if __name__ == "__main__":
    main()
