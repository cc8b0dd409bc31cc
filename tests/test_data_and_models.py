"""Every dataset reader and model trains for a few steps through the real entry points."""

from __future__ import annotations

import json

import pytest
import torch

from datasets import write_cifar10, write_imagefolder, write_mnist
from launched import launch
from common.rundir.names import CONFIG_FILE, SUMMARY_FILE

FEW_STEPS = ["--epochs", "1", "--max-steps", "2", "--batch-size", "8", "--threads", "1"]


def _summary(run_dir):
    return json.loads((run_dir / SUMMARY_FILE).read_text())


@pytest.mark.parametrize("dataset,model,writer,shape", [
    ("mnist", "mnist_net", write_mnist, (1, 28, 10)),
    ("cifar10", "resnet18", write_cifar10, (3, 32, 10)),
    ("imagefolder", "convnet", write_imagefolder, (3, 32, 3)),
])
def test_file_datasets_train(tmp_path, dataset, model, writer, shape):
    data_dir = writer(tmp_path / "data")
    run_dir = tmp_path / "run"
    extra = ["--image-size", "32"] if dataset == "imagefolder" else []
    launch("none-ddp", 1, ["--dataset", dataset, "--data-dir", str(data_dir), "--model", model,
                           "--run-dir", str(run_dir), *FEW_STEPS, *extra], timeout=180).check()
    config = json.loads((run_dir / CONFIG_FILE).read_text())
    channels, size, classes = shape
    assert (config["dataset"]["channels"], config["dataset"]["image_size"], config["dataset"]["num_classes"]) \
        == (channels, size, classes)
    assert _summary(run_dir)["steps"] == 2


@pytest.mark.parametrize("dataset", ["mnist", "cifar10", "imagefolder"])
def test_empty_data_dir_is_named_in_one_line(tmp_path, dataset):
    (tmp_path / "empty").mkdir()
    result = launch("none-hvd", 1, ["--dataset", dataset, "--data-dir", str(tmp_path / "empty"),
                                    "--run-dir", str(tmp_path / "run")], timeout=60)
    assert result.returncode == 2
    lines = [line for line in result.output.splitlines() if "error:" in line]
    assert len(lines) == 1 and str(tmp_path / "empty") in lines[0], result.output


def test_synthetic_any_shape_with_resnet(tmp_path):
    launch("none-hvd", 1, ["--dataset", "synthetic", "--image-size", "32", "--synthetic-samples", "64",
                           "--model", "resnet18", "--run-dir", str(tmp_path), *FEW_STEPS], timeout=180).check()
    config = json.loads((tmp_path / CONFIG_FILE).read_text())
    assert config["dataset"]["image_size"] == 32 and config["dataset"]["channels"] == 3


def test_pretrained_is_refused_offline(tmp_path):
    result = launch("none-ddp", 1, ["--model", "resnet18", "--pretrained", "--run-dir", str(tmp_path)], timeout=60)
    assert result.returncode == 2 and "--pretrained" in result.output and "cannot be downloaded" in result.output


def test_model_registry_adapts_to_dataset_shapes():
    from common.inputs.models import MODEL_BUILDERS, build_model

    for name in MODEL_BUILDERS:
        for channels, size, classes in ((1, 8, 10), (1, 28, 10), (3, 32, 7)):
            if name.startswith("resnet") and size < 32:
                continue
            model = build_model(name, channels, size, classes, seed=0)
            out = model.eval()(torch.zeros(2, channels, size, size))
            assert out.shape == (2, classes), (name, channels, size)
    # Same seed, same weights: the start every rank and backend shares.
    a, b = build_model("convnet", 1, 8, 10, seed=3), build_model("convnet", 1, 8, 10, seed=3)
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values(), strict=True))


def test_options_offer_exactly_what_the_registries_build():
    """--dataset, --model and --optimizer accept (and --help names) the registries' built-ins, no more and no
    fewer; a registry that does not match its option's names is refused when it is made."""
    import argparse

    from common.choices import FILE_DATASETS, PRETRAINABLE_MODELS, registry
    from common.config import build_parser
    from common.inputs.data import DATASET_BUILDERS
    from common.inputs.models import MIN_IMAGE_SIZE, MODEL_BUILDERS, NATURAL_IMAGE_SIZE
    from common.loop.optim import OPTIMIZER_BUILDERS

    options = {action.dest: action for action in build_parser("train", "")._actions}
    assert options["optimizer"].choices == tuple(OPTIMIZER_BUILDERS)
    for dest, builders in (("dataset", DATASET_BUILDERS), ("model", MODEL_BUILDERS)):
        assert options[dest].metavar.startswith("{" + ",".join(builders) + "}|"), options[dest].metavar
        assert [options[dest].type(name) for name in builders] == list(builders)
        with pytest.raises(argparse.ArgumentTypeError, match="choose one of " + ", ".join(builders)):
            options[dest].type("not_built_in")
    assert list(MIN_IMAGE_SIZE) == list(NATURAL_IMAGE_SIZE) == list(MODEL_BUILDERS)
    assert set(FILE_DATASETS) <= set(DATASET_BUILDERS) and set(PRETRAINABLE_MODELS) <= set(MODEL_BUILDERS)
    with pytest.raises(ValueError, match=r"no entry for \['b'\], not offered \['c'\]"):
        registry(("a", "b"), {"a": 1, "c": 2}, "test")


def test_seed_fixes_the_split_and_synthetic_samples():
    from common.config import Config
    from common.inputs.data import open_datasets

    first = open_datasets(Config(dataset="digits", seed=5))
    again = open_datasets(Config(dataset="digits", seed=5))
    other = open_datasets(Config(dataset="digits", seed=6))
    assert first[1].indices == again[1].indices != other[1].indices
    syn_config = Config(dataset="synthetic", image_size=16, synthetic_samples=32, seed=1)
    syn, syn_again = open_datasets(syn_config)[0], open_datasets(syn_config)[0]
    other_seed = open_datasets(Config(dataset="synthetic", image_size=16, synthetic_samples=32, seed=2))[0]
    assert torch.equal(syn[3][0], syn_again[3][0]) and syn[3][1] == syn_again[3][1]
    assert not torch.equal(syn[3][0], other_seed[3][0])


@pytest.mark.parametrize("dataset,keep_bytes", [("digits", None), ("synthetic", None), ("synthetic", 0)])
def test_in_memory_loaders_fetch_whole_batches_with_per_sample_values(dataset, keep_bytes):
    """Digits and synthetic data are fetched a batch per call (not a sample per call and a
    collate), and the batches are exactly what a per-sample DataLoader over the same sampler gives,
    also from a mid-epoch position and for the validation shard."""
    from torch.utils.data import BatchSampler, DataLoader

    from common.config import Config
    from common.inputs.data import SyntheticImages, make_loaders, open_datasets

    config = Config(dataset=dataset, image_size=12, synthetic_samples=200, batch_size=16, seed=4)
    train, val, _ = open_datasets(config)
    if keep_bytes is not None:  # a synthetic set too large to keep: generated batch by batch
        generated = SyntheticImages(200, 3, 12, 10, 4, keep_bytes=keep_bytes)
        assert generated.images is None and train.dataset.images is not None
        assert torch.equal(generated[list(range(200))][0], train.dataset.images)
        train.dataset, val.dataset = generated, generated
    train_loader, val_loader, sampler = make_loaders(config, train, val, rank=1, world_size=2, pin_memory=False)
    for loader in (train_loader, val_loader):
        assert loader.batch_size is None and isinstance(loader.sampler, BatchSampler)
    sampler.set_epoch(3)
    sampler.skip = 5
    per_sample_train = DataLoader(train, batch_size=16, sampler=list(sampler))
    per_sample_val = DataLoader(val_loader.dataset, batch_size=16)
    for fast, plain in ((train_loader, per_sample_train), (val_loader, per_sample_val)):
        fast_batches, plain_batches = list(fast), list(plain)
        assert len(fast_batches) == len(plain_batches) == len(fast) > 1
        for (images, labels), (ref_images, ref_labels) in zip(fast_batches, plain_batches, strict=True):
            assert images.dtype == ref_images.dtype and labels.dtype == ref_labels.dtype
            assert torch.equal(images, ref_images) and torch.equal(labels, ref_labels)
