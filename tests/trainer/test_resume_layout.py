"""A resumed optimizer's state takes its parameters' memory layout (channels_last on CUDA).

The checkpointer's background copy on CUDA lands every tensor in a contiguous pinned buffer, so
a checkpoint holds momentum buffers contiguous while a channels_last model's weights are not;
CUDA's fused SGD and AdamW then refused the resumed run's first step (seen on an H200:
``check_fast_path_restrictions``). The end-to-end check is the GPU resume test in
``test_input_pipeline.py``; here, on the CPU, the layouts and values themselves.
"""

from __future__ import annotations

import io

import pytest
import torch

from trainer.resume import match_parameter_layouts


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.BatchNorm2d(8))
    return model.to(memory_format=torch.channels_last)


def _as_the_pinned_copy_writes_it(state: dict) -> dict:
    """torch.save/torch.load of a state whose tensors went through contiguous buffers."""

    def contiguous(value):
        if isinstance(value, torch.Tensor):
            return torch.empty(value.shape, dtype=value.dtype).copy_(value)
        if isinstance(value, dict):
            return {k: contiguous(v) for k, v in value.items()}
        return value

    buffer = io.BytesIO()
    torch.save(contiguous(state), buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)


@pytest.mark.parametrize(
    "make",
    [
        lambda params: torch.optim.SGD(params, lr=0.1, momentum=0.9, nesterov=True),
        lambda params: torch.optim.AdamW(params, lr=0.01),
    ],
    ids=["sgd", "adamw"],
)
def test_state_tensors_take_their_parameters_strides_and_keep_their_values(make):
    model = _model()
    optimizer = make(model.parameters())
    model(torch.randn(2, 3, 8, 8)).sum().backward()
    optimizer.step()
    saved = _as_the_pinned_copy_writes_it(optimizer.state_dict())

    resumed = make(model.parameters())
    resumed.load_state_dict(saved)
    conv_weight = model[0].weight
    assert conv_weight.is_contiguous(memory_format=torch.channels_last)
    momentum_like = [v for v in resumed.state[conv_weight].values() if v.shape == conv_weight.shape]
    assert any(v.stride() != conv_weight.stride() for v in momentum_like)  # as before the fix

    match_parameter_layouts(resumed)

    for param, state in resumed.state.items():
        for key, value in state.items():
            if value.shape == param.shape:
                assert value.stride() == param.stride(), key
                assert value.device == param.device and value.dtype == param.dtype
            assert torch.equal(value, optimizer.state[param][key]), key
