"""The test-speed stand-in for kfp's ``inspect.stack()`` call (tests/kfp_caller_name.py) keeps
kfp's behaviour: the same frame records, and the error still names the method called."""

# No "from __future__ import annotations": kfp reads the component's annotations as types.
import inspect

import pytest
from kfp import dsl
from kfp.dsl import pipeline_task

from tests import kfp_caller_name


def test_installed_for_this_session():
    assert pipeline_task.inspect is not inspect, (
        "tests/kfp_caller_name.py installed nothing: kfp's PipelineTask no longer calls "
        f"{kfp_caller_name.KFP_CALL}; delete the stand-in if the call is gone for good"
    )


def test_the_records_are_inspect_stacks():
    def caller():
        return callee()

    def callee():
        cheap, real = pipeline_task.inspect.stack(), inspect.stack()
        return [cheap[n][:4] for n in range(3)], [real[n][:4] for n in range(3)]

    cheap, real = caller()
    assert [record[1:4] for record in cheap[1:]] == [record[1:4] for record in real[1:]]
    assert cheap[1][3] == "caller" and cheap[0][3] == "callee"
    assert cheap[0][0] is real[0][0]  # the same frame (its line moved on to the second call)


def test_kfp_still_names_the_method_on_a_pipeline_used_as_a_component():
    @dsl.component(base_image="python:3.11")
    def step() -> None:
        pass

    @dsl.pipeline
    def inner() -> None:
        step()

    with pytest.raises(ValueError, match="^set_cpu_request can only be used on single-step"):

        @dsl.pipeline
        def outer() -> None:
            inner().set_cpu_request("1")
