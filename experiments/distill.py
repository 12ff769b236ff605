"""Distil an HMM from a causal LM: ``python -m experiments.distill [overrides]``.

Samples from the LM, initialises by latent-variable distillation, trains with mini-batch EM and
writes the checkpoint, ``curve.json``/``curve.png`` and ``metrics.json`` to ``output.dir``
(see configs/distill.yaml and :func:`ctrlg.hmm.distill.distill`).
"""

import json

import hydra
from omegaconf import DictConfig, OmegaConf

from experiments.common import report_errors


@hydra.main(config_path="../configs", config_name="distill", version_base=None)
@report_errors
def main(cfg: DictConfig) -> dict:
    from ctrlg.hmm.distill import distill

    metrics = distill(OmegaConf.to_container(cfg, resolve=True))
    print(json.dumps(metrics, indent=2))
    return metrics


if __name__ == "__main__":
    main()
