"""The streamed input pipeline: seeded windows, CPU and GPU decoding, workers, /dev/shm, feeding.

The GPU-decode tests need CUDA and a torchvision that decodes JPEGs on it; elsewhere they skip
and say why. Everything the GPU path does on the CPU (reading bytes, drawing windows, batching)
is tested here without one.
"""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from tests.trainer.trainer_launch import REPO, TINY, base_env, load_weights
from trainer.data import Normalizer, _v2, load_image, resize_crop
from trainer.distributed import available_cpus
from trainer.errors import ConfigError, DataError
from trainer.folder_data import resolve_decode
from trainer.gpu_decode import (
    NO_AUGMENTATION,
    EncodedBatch,
    collate_encoded,
    gpu_decode_problem,
    read_encoded,
)
from trainer.listing import load_splits, scan_split
from trainer.loader import (
    DecodedImages,
    DeviceFeeder,
    EncodedImages,
    EpochBatchSampler,
    StreamedImages,
    default_num_workers,
    prefetch_depth,
    worker_context,
)
from trainer.randomness import derive_seed, sample_augmentation
from trainer.train import main

CUDA = torch.device("cuda")


def _gpu_decode_skip_reason() -> str | None:
    if not torch.cuda.is_available():
        return "needs a CUDA GPU (torch.cuda.is_available() is False here)"
    return gpu_decode_problem(CUDA)


needs_gpu_decode = pytest.mark.skipif(
    _gpu_decode_skip_reason() is not None,
    reason=f"GPU JPEG decoding: {_gpu_decode_skip_reason()}",
)


# ------------------------------------------------------------------------------------- data
def _picture(height: int, width: int, k: int, rng: np.random.Generator) -> np.ndarray:
    """Smooth, asymmetric content (so flips and crops show) with a little noise."""
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    red = 255 * x / width
    green = 127 + 100 * np.sin((y + 7 * k) / (5 + k))
    blue = 255 * ((x + 2 * y) % 97) / 97
    pixels = np.stack([red, green, blue], axis=-1) + rng.normal(0, 4, (height, width, 3))
    return np.clip(pixels, 0, 255).astype(np.uint8)


def write_jpeg_folder(root: Path, per_class: int = 4, seed: int = 0) -> Path:
    """``root/train/<class>/`` of JPEGs in every variant a data set has, plus ``root/val/``.

    Per class: baseline RGB JPEGs of assorted sizes, one progressive, one greyscale, one CMYK
    JPEG and one PNG (the last two are what nvJPEG cannot take as they are).
    """
    rng = np.random.default_rng(seed)
    sizes = [(120, 160), (90, 200), (150, 113), (64, 64)]
    for split, count in (("train", per_class), ("val", 2)):
        for k, name in enumerate(("ant", "bee")):
            folder = root / split / name
            folder.mkdir(parents=True, exist_ok=True)
            for i in range(count):
                height, width = sizes[(i + k) % len(sizes)]
                image = Image.fromarray(_picture(height, width, k, rng))
                image.save(folder / f"{split}-{i}.jpg", quality=92)
            image = Image.fromarray(_picture(100, 130, k, rng))
            image.save(folder / "progressive.jpg", quality=90, progressive=True)
            image.convert("L").save(folder / "grey.jpg", quality=90)
            image.convert("CMYK").save(folder / "cmyk.jpg", quality=90)
            image.save(folder / "lossless.png")
    return root


@pytest.fixture
def jpeg_folder(tmp_path) -> Path:
    return write_jpeg_folder(tmp_path / "jpegs")


def _old_train_transform(image_size: int):
    """The trainer's streamed training transform before it drew its own windows."""
    v2 = _v2()
    return v2.Compose(
        [
            v2.PILToTensor(),
            v2.RandomResizedCrop(image_size, scale=(0.35, 1.0), antialias=True),
            v2.RandomHorizontalFlip(),
        ]
    )


# --------------------------------------------------------------------------- seeded windows
def test_windows_are_torchvisions_draws_from_the_same_seeds():
    """Same windows as RandomResizedCrop + RandomHorizontalFlip seeded the old way."""
    v2 = _v2()
    crop = v2.RandomResizedCrop(8, scale=(0.35, 1.0))
    for height, width in ((375, 500), (64, 64), (10, 300), (300, 10)):  # the last two fall back
        image = torch.zeros(3, height, width, dtype=torch.uint8)
        for index in range(40):
            seed = derive_seed(11, "sample", 3, index)
            torch.manual_seed(seed)
            expected = crop.make_params([image])
            flip = bool(torch.rand(1) < 0.5)
            drawn = sample_augmentation(11, 3, index, height, width, "crop-flip")
            assert drawn is not None
            assert (drawn.top, drawn.left, drawn.height, drawn.width) == (
                expected["top"],
                expected["left"],
                expected["height"],
                expected["width"],
            )
            assert drawn.flip == flip
    assert sample_augmentation(1, 0, 0, 10, 10, "none") is None
    assert not any(sample_augmentation(1, 0, i, 50, 50, "crop").flip for i in range(20))


def test_cpu_decoding_gives_the_old_pixels_bit_for_bit(jpeg_folder):
    listing = scan_split(jpeg_folder / "train")
    dataset = DecodedImages(listing, image_size=24, augment="crop-flip", seed=5)
    old = _old_train_transform(24)
    for index in range(len(listing)):
        torch.manual_seed(derive_seed(5, "sample", 2, index))
        expected = old(load_image(listing.path(index)))
        image, label = dataset[(index, 2)]
        assert torch.equal(image, expected), listing.path(index)
        assert label == listing.label(index)
        evaluated, _ = dataset[(index, None)]
        assert torch.equal(evaluated, resize_crop(24)(load_image(listing.path(index))))


# ------------------------------------------------------------------ the workers of --decode gpu
def test_read_encoded_passes_jpegs_through_and_reencodes_the_rest(jpeg_folder):
    folder = jpeg_folder / "train" / "ant"
    for name in ("train-0.jpg", "progressive.jpg", "grey.jpg"):
        encoded = read_encoded(str(folder / name))
        assert encoded.data == (folder / name).read_bytes()
        assert (encoded.height, encoded.width) == Image.open(folder / name).size[::-1]
    for name in ("cmyk.jpg", "lossless.png"):
        encoded = read_encoded(str(folder / name))
        with Image.open(io.BytesIO(encoded.data)) as image:
            assert image.format == "JPEG" and image.mode == "RGB"
            assert image.size == (130, 100) == (encoded.width, encoded.height)
    broken = folder / "broken.jpg"
    broken.write_bytes(b"\xff\xd8 not really")
    with pytest.raises(DataError, match=f"cannot read image {broken}"):
        read_encoded(str(broken))


def test_a_worker_batch_of_encoded_images_carries_the_cpu_windows(jpeg_folder):
    listing = scan_split(jpeg_folder / "train")
    sampler = EpochBatchSampler(len(listing), 4, rank=0, world_size=1, seed=9)
    sampler.set_position(epoch=1, start_batch=0)
    loader = torch.utils.data.DataLoader(
        EncodedImages(listing, image_size=32, augment="crop-flip", seed=9),
        batch_sampler=sampler,
        collate_fn=collate_encoded,
        num_workers=1,
        multiprocessing_context=worker_context(),
    )
    seen = 0
    for batch, keys in zip(loader, sampler, strict=True):
        assert isinstance(batch, EncodedBatch) and batch.data.dtype == torch.uint8
        for payload, window, label, (index, epoch) in zip(
            batch.payloads(), batch.windows.tolist(), batch.labels.tolist(), keys, strict=True
        ):
            with Image.open(io.BytesIO(payload.numpy().tobytes())) as image:
                width, height = image.size
                assert image.format == "JPEG"
            expected = sample_augmentation(9, epoch, index, height, width, "crop-flip")
            assert tuple(window) == (*expected[:4], int(expected.flip))
            assert label == listing.label(index)
            seen += 1
    assert seen == len(listing) // 4 * 4
    evaluation = EncodedImages(listing, image_size=32, augment="crop-flip", seed=9)[(0, None)]
    assert evaluation.window == NO_AUGMENTATION


def assert_like_the_cpu_path(images: torch.Tensor, cpu: DecodedImages, keys: list) -> None:
    """``images`` (uint8, one per key) are the CPU path's images of ``keys``: the same windows
    and flips, pixels within a decoder's rounding (measured up to ~4.4 of 255 on these noisy
    pictures); a wrong window or flip costs far more."""
    expected = torch.stack([cpu[key][0] for key in keys])
    assert images.shape == expected.shape and images.dtype == torch.uint8
    for image, wanted, key in zip(images.float(), expected.float(), keys, strict=True):
        difference = (image - wanted).abs().mean().item()
        mirrored = (image - wanted.flip(-1)).abs().mean().item()
        assert difference < 6.0, (cpu.listing.path(key[0]), key[1], difference)
        assert 3 * difference < mirrored, (cpu.listing.path(key[0]), key[1], difference, mirrored)


def test_the_gpu_paths_crop_stage_matches_the_cpu_path_on_cpu_tensors(jpeg_folder):
    """GpuJpegDecoder.crop is plain tensor code: fed PIL's decode of the batch's JPEGs instead
    of nvJPEG's, it gives the CPU path's pixels, windows and flips."""
    from trainer.gpu_decode import DecodedJpegs, GpuJpegDecoder

    def pil_decoded(payload: torch.Tensor) -> torch.Tensor:
        with Image.open(io.BytesIO(payload.numpy().tobytes())) as image:
            return torch.from_numpy(np.array(image.convert("RGB"))).permute(2, 0, 1)

    stage = GpuJpegDecoder(torch.device("cpu"), 40)
    listing = scan_split(jpeg_folder / "train")
    cpu = DecodedImages(listing, image_size=40, augment="crop-flip", seed=6)
    encoded = EncodedImages(listing, image_size=40, augment="crop-flip", seed=6)
    for epoch in (0, 1, None):
        keys = [(i, epoch) for i in range(len(listing))]
        batch = collate_encoded([encoded[key] for key in keys])
        images = [pil_decoded(payload) for payload in batch.payloads()]
        cropped = stage.crop(DecodedJpegs(images, batch.windows, batch.labels))
        # The CPU path decodes large crops at a reduced JPEG scale (draft), in uint8.
        assert_like_the_cpu_path(cropped, cpu, keys)


# ---------------------------------------------------------------------- workers and /dev/shm
def test_worker_count_follows_the_cgroup_cpu_quota(tmp_path, monkeypatch):
    affinity = len(os.sched_getaffinity(0))
    v2 = tmp_path / "v2"
    v2.mkdir()
    (v2 / "cpu.max").write_text("100000 100000\n")  # 1 CPU
    assert available_cpus(v2) == 1
    (v2 / "cpu.max").write_text("max 100000\n")  # no quota: the affinity mask
    assert available_cpus(v2) == affinity
    v1 = tmp_path / "v1"
    (v1 / "cpu").mkdir(parents=True)
    (v1 / "cpu" / "cpu.cfs_quota_us").write_text("150000\n")
    (v1 / "cpu" / "cpu.cfs_period_us").write_text("100000\n")
    assert available_cpus(v1) == 1
    (v1 / "cpu" / "cpu.cfs_quota_us").write_text("-1\n")
    assert available_cpus(v1) == affinity

    cuda, cpu = torch.device("cuda", 0), torch.device("cpu")
    assert default_num_workers(cuda, 1, cpus=16) == 15  # no cap of 12 any more
    assert default_num_workers(cuda, 8, cpus=128) == 15  # split among the node's processes
    assert default_num_workers(cuda, 8, cpus=16) == 2  # at least 2
    assert default_num_workers(cpu, 1, cpus=16) == 0  # CPU training: the cores compute
    import trainer.loader

    # Without cpus=, the quota is read (available_cpus, as the loader imported it): 10 CPUs give
    # 2 processes 4 workers each, which neither a 2-core machine (2) nor a 16-core one (7) would.
    monkeypatch.setattr(trainer.loader, "available_cpus", lambda: 10)
    assert default_num_workers(cuda, 2) == 4


def test_prefetch_depth_keeps_batches_in_flight_within_half_of_dev_shm():
    batch = 256 * 3 * 224 * 224  # 36.75 MiB of uint8 pixels
    depth, warning = prefetch_depth(batch, workers=15, local_processes=8, shm_total=64 * 2**30)
    assert (depth, warning) == (4, None)  # 8 x 15 x 4 batches = 17.2 GiB, within 32 GiB
    depth, warning = prefetch_depth(batch, workers=15, local_processes=8, shm_total=16 * 2**30)
    assert (depth, warning) == (1, None)  # 8 x 15 x 1 = 4.3 GiB; 2 would need 8.6 > 8 GiB
    depth, warning = prefetch_depth(batch, workers=4, local_processes=1, shm_total=64 * 2**20)
    assert depth == 1 and "/dev/shm holds 64 MiB" in warning and "emptyDir" in warning
    assert prefetch_depth(batch, workers=0, local_processes=1, shm_total=2**20) == (0, None)
    assert prefetch_depth(batch, workers=2, local_processes=1, shm_total=None) == (4, None)


# ------------------------------------------------------------------------------ --decode
def test_decode_gpu_is_refused_without_a_gpu_and_auto_falls_back(tmp_path, jpeg_folder):
    assert resolve_decode("cpu", torch.device("cpu")) == ("cpu", None)
    assert resolve_decode("auto", torch.device("cpu")) == ("cpu", None)
    with pytest.raises(ConfigError, match="--decode gpu cannot work here: the training device"):
        resolve_decode("gpu", torch.device("cpu"))
    args = ["--data-dir", jpeg_folder, "--output-dir", tmp_path / "out", *TINY, "--device", "cpu"]
    args += ["--decode", "gpu", "--cache-images", "never", "--max-steps", "1"]
    assert main([str(a) for a in args]) == 2
    with pytest.raises(SystemExit) as exit_info:
        main([*map(str, args[:-5]), "--decode", "fast"])
    assert exit_info.value.code == 2


def test_the_device_feeder_runs_inline_on_the_cpu():
    calls = []

    def prepare(batch):
        calls.append(batch)
        return batch, batch

    feed = DeviceFeeder(torch.device("cpu"), [lambda batch: batch * 10, prepare])
    assert feed.streams is None
    stream = feed(iter([1, 2, 3]))
    assert calls == [] and next(stream) == (10, 10) and calls == [10]  # nothing read ahead


# ------------------------------------------------------------------------------ on a GPU
@needs_gpu_decode
def test_gpu_decoding_matches_the_cpu_path(jpeg_folder):
    from trainer.gpu_decode import GpuJpegDecoder

    listing = scan_split(jpeg_folder / "train")
    cpu = DecodedImages(listing, image_size=48, augment="crop-flip", seed=4)
    gpu = EncodedImages(listing, image_size=48, augment="crop-flip", seed=4)
    decoder = GpuJpegDecoder(CUDA, 48)
    for epoch in (0, 1, None):
        keys = [(i, epoch) for i in range(len(listing))]
        decoded = decoder(collate_encoded([gpu[key] for key in keys])).cpu()
        # nvJPEG and libjpeg-turbo upsample chroma and round differently.
        assert_like_the_cpu_path(decoded, cpu, keys)


@needs_gpu_decode
def test_gpu_decoded_epoch_replays_exactly_from_mid_epoch(jpeg_folder):
    splits = load_splits(jpeg_folder, val_fraction=0.1, seed=0)
    normalize = Normalizer([0.5] * 3, [0.5] * 3, CUDA, channels_last=True)
    source = StreamedImages(
        splits.train,
        splits.val,
        image_size=32,
        augment="crop-flip",
        batch_size=4,
        rank=0,
        world_size=1,
        seed=3,
        num_workers=1,
        normalize=normalize,
        decode="gpu",
    )
    full = list(source.epoch(1))
    assert len(full) == source.steps_per_epoch == 4
    assert full[0][0].device.type == "cuda" and full[0][0].is_contiguous(
        memory_format=torch.channels_last
    )
    tail = list(source.epoch(1, start_batch=2))
    assert len(tail) == 2
    for (images, labels), (expected_images, expected_labels) in zip(tail, full[2:], strict=True):
        assert torch.equal(images, expected_images) and torch.equal(labels, expected_labels)
    stopped = source.epoch(2)
    next(stopped)
    stopped.close()  # a run stopping mid-epoch: the feeder's thread ends, nothing hangs
    again = list(source.epoch(1))
    assert all(torch.equal(a[0], b[0]) for a, b in zip(again, full, strict=True))
    assert sum(len(labels) for _, labels in source.validation(8)) == len(splits.val)


@needs_gpu_decode
def test_gpu_decoded_training_resumes_bit_exact_after_sigkill(tmp_path, jpeg_folder):
    def args(out):
        return [
            str(a)
            for a in [
                "--data-dir", jpeg_folder, "--output-dir", out, *TINY, "--device", "cuda",
                "--decode", "gpu", "--cache-images", "never", "--num-workers", "2",
                "--batch-size", "2", "--epochs", "20", "--deterministic", "--seed", "7",
                "--checkpoint-every-steps", "3", "--image-size", "32",
            ]
        ]  # fmt: skip

    def run(out, **popen):
        return subprocess.Popen(
            [sys.executable, "-m", "trainer.train", *args(out)], cwd=REPO, env=base_env(), **popen
        )

    reference = run(tmp_path / "ref", stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    log = reference.communicate(timeout=300)[0].decode()
    assert reference.returncode == 0, log
    assert "decode on gpu" in log

    crashed = run(tmp_path / "crash", stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    checkpoints = tmp_path / "crash" / "checkpoints"
    deadline = time.monotonic() + 240
    while not list(checkpoints.glob("step-*/COMPLETE")) and time.monotonic() < deadline:
        time.sleep(0.01)
    crashed.send_signal(signal.SIGKILL)
    crashed.wait()
    resumed = run(tmp_path / "crash", stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    log = resumed.communicate(timeout=300)[0].decode()
    assert resumed.returncode == 0, log
    summary = json.loads((tmp_path / "crash" / "summary.json").read_text())
    assert 3 <= (summary["resumed_from_step"] or 0) < summary["steps"], log
    expected, actual = (
        load_weights(tmp_path / "ref" / "model"),
        load_weights(tmp_path / "crash" / "model"),
    )
    assert [k for k in expected if not torch.equal(expected[k], actual[k])] == []
