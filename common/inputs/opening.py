"""Everything a run trains on and starts from, opened and checked in one go on every rank before any
collective: the datasets, the model built for them from the seed, its trial step, and its initial weights
moved as --perturb-ulp says."""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn
from torch.utils.data import Dataset

from common.config import Config
from .data import DataInfo, open_datasets
from .factories import parse_literals
from .modelcheck import check_trainable
from .models import ModelChoice, build_model, choose_model
from .perturb import perturb_ulp


@dataclass(frozen=True)
class Inputs:
    """What --model names, the training and validation sets, the shape of their samples, and the model built
    for them (every rank alike, before the first broadcast)."""

    model_choice: ModelChoice
    train_set: Dataset
    val_set: Dataset
    info: DataInfo
    model: nn.Module


def open_inputs(config: Config) -> Inputs:
    """Open the data, build the model for it and check that it trains, then move its initial weights as
    --perturb-ulp says. UsageError, ValueError or RuntimeError name bad input."""
    model_choice = choose_model(config.model)
    train_set, val_set, info = open_datasets(config, model_choice.natural_image_size)
    model = build_model(model_choice, info.channels, info.image_size, info.num_classes, config.seed,
                        parse_literals(config.model_arg))
    check_trainable(model, config.model, train_set, info.num_classes, exact=config.exact)
    perturb_ulp(model, config.perturb_ulp, config.perturb_pattern)
    return Inputs(model_choice, train_set, val_set, info, model)
