"""The torchvision import helper: works on CPU torch, and is a no-op when the C++ ops load."""

import subprocess
import sys

import torch

from trainer.tv_compat import cpu_stub_ops_installed, import_torchvision


def test_models_and_transforms_work():
    tv = import_torchvision()
    from torchvision.transforms import v2

    model = tv.models.get_model("resnet18", num_classes=4)
    batch = v2.Compose([v2.ToDtype(torch.float32, scale=True)])(
        torch.zeros(2, 3, 32, 32, dtype=torch.uint8)
    )
    assert model(batch).shape == (2, 4)


def test_stub_only_when_the_extension_cannot_load():
    # Decide from a fresh interpreter whether the compiled ops load on this machine, then check
    # that the helper installed stub schemas exactly in that case.
    probe = (
        "import torch, importlib.util, pathlib, sys\n"
        "loc = importlib.util.find_spec('torchvision').submodule_search_locations[0]\n"
        "so = next(pathlib.Path(loc).glob('_C*.so'))\n"
        "try:\n    torch.ops.load_library(str(so)); print('loads')\n"
        "except OSError:\n    print('fails')\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True
    )
    import_torchvision()
    assert cpu_stub_ops_installed() == (result.stdout.strip() == "fails")


def test_importing_the_helper_does_not_import_torchvision():
    code = "import sys, trainer.tv_compat; print('torchvision' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
