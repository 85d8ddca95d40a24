"""TrainConfig validation, config files, and the CLI's exit codes for bad flags and data."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import click
import pytest

from tests.image_data import write_image_folder
from tests.trainer.trainer_launch import TINY
from trainer.config import TrainConfig, config_from, load_config_file
from trainer.errors import ConfigError
from trainer.flags import parse_flags, trainer_command
from trainer.train import main, run_training


@pytest.fixture
def data(tmp_path) -> Path:
    return write_image_folder(tmp_path / "data")


@pytest.mark.parametrize(
    ("changes", "words"),
    [
        ({"batch_size": 0}, ["--batch-size", "0", ">= 1"]),
        ({"precision": "fp8"}, ["--precision", "'fp8'", "fp32, bf16, fp16"]),
        ({"optimizer": "lamb"}, ["--optimizer", "'lamb'", "sgd, adamw"]),
        ({"lr": -1.0}, ["--lr", "-1.0", "positive"]),
        ({"lr": float("inf")}, ["--lr", "inf", "positive"]),  # every step's update is inf
        ({"collective_timeout_s": float("inf")}, ["--collective-timeout-s", "inf", "seconds"]),
        ({"label_smoothing": 1.0}, ["--label-smoothing", "1.0", "[0, 1)"]),
        ({"val_fraction": 0.0}, ["--val-fraction", "0.0", "(0, 1)"]),
        ({"model": "resnet9000"}, ["--model", "'resnet9000'", "resnet18"]),
        ({"epochs": "ten"}, ["--epochs", "'ten'", "int"]),
        ({"synthetic": True}, ["--data-dir", "--synthetic", "exactly one"]),
        ({"data_dir": "/no/such/folder"}, ["--data-dir", "/no/such/folder"]),
    ],
)
def test_invalid_values_name_flag_value_and_allowed(tmp_path, data, changes, words):
    values = {"output_dir": tmp_path / "out", "data_dir": data} | changes
    with pytest.raises(ConfigError) as err:
        TrainConfig(**values)
    for word in words:
        assert word in str(err.value)


def test_defaults_and_derived_values(tmp_path, data):
    config = TrainConfig(output_dir=tmp_path / "out", data_dir=str(data), optimizer="adamw")
    assert config.checkpoint_dir == tmp_path / "out" / "checkpoints"
    assert config.data_dir == data and isinstance(config.data_dir, Path)
    assert config.lr == 1e-3 and config.weight_decay == 0.05
    assert TrainConfig(output_dir=tmp_path, synthetic=True).lr == 0.1


def test_yaml_and_json_files_with_cli_overrides(tmp_path, data):
    yaml_file = tmp_path / "train.yaml"
    yaml_file.write_text(
        f"data-dir: {data}\noutput_dir: {tmp_path / 'out'}\nepochs: 7\nbatch_size: 16\n"
        "precision: bf16\nchannels_last: true\ngrad_clip_norm: 1\n"
    )
    cli = parse_flags(["--batch-size", "32", "--no-channels-last"])
    assert cli == {"batch_size": 32, "channels_last": False}  # only what the command line set
    config = config_from(load_config_file(yaml_file), cli)
    assert (config.epochs, config.batch_size, config.precision) == (7, 32, "bf16")
    assert config.channels_last is False and config.grad_clip_norm == 1.0

    json_file = tmp_path / "train.json"
    json_file.write_text(json.dumps({"synthetic": True, "output_dir": str(tmp_path / "o")}))
    assert config_from(load_config_file(json_file)).synthetic is True

    bad = tmp_path / "bad.yaml"
    bad.write_text("output_dir: x\nbatch_sise: 3\n")
    with pytest.raises(ConfigError, match="unknown setting 'batch_sise'"):
        load_config_file(bad)


def test_config_file_run_end_to_end(tmp_path, data):
    config_file = tmp_path / "train.json"
    settings = {"data_dir": str(data), "output_dir": str(tmp_path / "out"), "batch_size": 4}
    settings |= {"model": "mobilenet_v3_small", "image_size": 16, "max_steps": 9}
    config_file.write_text(json.dumps(settings))
    assert main(["--config", str(config_file), "--max-steps", "2"]) == 0
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["steps"] == 2 and summary["arch"] == "mobilenet_v3_small"
    model_json = json.loads((tmp_path / "out" / "model" / "model.json").read_text())
    assert model_json["format_version"] == 1 and model_json["num_classes"] == 3
    assert model_json["image_size"] == 16 and len(model_json["mean"]) == 3


def test_bad_flags_exit_2_with_clear_message(tmp_path, data, capsys):
    base = ["--data-dir", str(data), "--output-dir", str(tmp_path / "out")]
    assert main([*base, "--batch-size", "0"]) == 2
    assert "--batch-size 0 is too small" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_info:
        main([*base, "--precision", "fp8"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "--precision" in err and "'fp8'" in err and "fp16" in err
    assert main([*base, "--config", str(tmp_path / "missing.yaml")]) == 2
    assert "missing.yaml" in capsys.readouterr().err
    assert main(["--data-dir", str(data)]) == 2
    assert "--output-dir is required" in capsys.readouterr().err
    # Batch larger than a rank's share of the data: a config error, found after listing data.
    assert main([*base, *TINY, "--batch-size", "64"]) == 2
    assert "--batch-size 64 is larger" in capsys.readouterr().err
    assert not (tmp_path / "out" / "model").exists()


def test_inconsistent_distributed_env_exits_2(tmp_path, data, capsys):
    config = TrainConfig(output_dir=tmp_path / "out", data_dir=data)
    assert run_training(config, environ={"RANK": "0", "WORLD_SIZE": "2"}) == 2
    assert "MASTER_ADDR/MASTER_PORT are not set" in capsys.readouterr().err


def test_empty_class_folder_exits_3_naming_it(tmp_path, data, capsys):
    (data / "train" / "empty").mkdir()
    code = main(["--data-dir", str(data), "--output-dir", str(tmp_path / "out"), *TINY])
    assert code == 3
    assert f"class folder {data / 'train' / 'empty'} has no images" in capsys.readouterr().err


def test_unreadable_image_exits_3_naming_it(tmp_path, data, capsys):
    broken = data / "train" / "circle" / "broken.png"
    broken.write_bytes(b"\x89PNG not really")
    code = main(["--data-dir", str(data), "--output-dir", str(tmp_path / "out"), *TINY])
    assert code == 3
    err = capsys.readouterr().err
    assert "1 of " in err and "images cannot be read" in err
    assert "train/circle/broken.png (class circle)" in err


def test_checkpoint_of_another_model_is_a_config_error(tmp_path, data, capsys):
    base = ["--data-dir", str(data), "--output-dir", str(tmp_path / "out"), *TINY]
    assert main([*base, "--max-steps", "1", "--batch-size", "4"]) == 0
    code = main([*base, "--model", "squeezenet1_1", "--image-size", "64", "--batch-size", "4"])
    assert code == 2
    assert "holds a run of --model 'mobilenet_v3_small'" in capsys.readouterr().err


def test_help_shows_every_flags_default(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--help"])
    assert exit_info.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "--batch-size INTEGER Images per step per process" in text
    assert "[default: 64]" in text and "[default: auto]" in text
    assert "--output-dir PATH Where model/" in text and "(required)" in text
    fields = {f.name for f in dataclasses.fields(TrainConfig)}
    for option in trainer_command().params:
        if option.name in fields:
            help_text = option.get_help_record(click.Context(trainer_command()))[1]
            assert "default" in help_text or "(required)" in help_text, option.name


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--batch-size", "zero"], ["--batch-size", "'zero' is not a valid integer"]),
        (["--no-such-flag"], ["No such option '--no-such-flag'"]),
        (["--grad-compression", "int8"], ["--grad-compression", "'int8'"]),
    ],
)
def test_malformed_flags_exit_2(args, words, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--output-dir", "out", "--synthetic", *args])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert all(word in err for word in words), err


def test_paths_and_sizes_that_cannot_work_exit_2(tmp_path, data, capsys):
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    base = ["--data-dir", str(data), *TINY, "--max-steps", "1", "--batch-size", "4"]
    assert main([*base, "--output-dir", str(a_file)]) == 2
    assert f"--output-dir {a_file} is a file" in capsys.readouterr().err
    out = ["--output-dir", str(tmp_path / "out")]
    assert main([*base, *out, "--checkpoint-dir", str(a_file)]) == 2
    assert f"--checkpoint-dir {a_file} is a file" in capsys.readouterr().err
    assert main([*base, *out, "--model", "squeezenet1_1"]) == 2  # TINY: 16 px images
    err = capsys.readouterr().err
    assert "--image-size 16 does not fit --model squeezenet1_1" in err and "or more" in err
    # A ViT takes the one size it is built for (its assertion was no ConfigError: exit 1)
    assert main([*base, *out, "--model", "vit_b_16"]) == 2
    err = capsys.readouterr().err
    assert "--image-size 16 does not fit --model vit_b_16" in err and "--image-size 224" in err
    assert main([*base, *out, "--batch-size", "1"]) == 2  # BatchNorm: one value a channel
    err = capsys.readouterr().err
    assert "--batch-size 1 does not fit --model mobilenet_v3_small at --image-size 16" in err
    assert not (tmp_path / "out").exists()
