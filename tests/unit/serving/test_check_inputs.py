"""check_inputs: names, shapes and dtypes against a signature, with safe casts and no needless copies."""

from __future__ import annotations

import numpy as np
import pytest

from dlcloud.serving.errors import BadRequest
from dlcloud.serving.loaders import check_inputs
from dlcloud.serving.loaders.base import check_declared_names
from dlcloud.serving.types import Signature, TensorSpec

SIGNATURE = Signature(
    inputs=(TensorSpec("x", "FP32", (-1, 3)), TensorSpec("ids", "INT32", (-1,))),
    outputs=(TensorSpec("y", "FP32", (-1,)),),
)


def batch(n=2, x_dtype=np.float32, ids_dtype=np.int32):
    return {"x": np.ones((n, 3), dtype=x_dtype), "ids": np.arange(n, dtype=ids_dtype)}


def test_matching_inputs_pass_without_a_copy():
    inputs = batch()
    checked = check_inputs(SIGNATURE, inputs)
    assert checked["x"] is inputs["x"] and checked["ids"] is inputs["ids"]


def test_within_kind_casts_are_made():
    checked = check_inputs(SIGNATURE, batch(x_dtype=np.float64, ids_dtype=np.int64))
    assert checked["x"].dtype == np.float32 and checked["ids"].dtype == np.int32
    ints_to_floats = check_inputs(SIGNATURE, {"x": np.ones((1, 3), np.int64), "ids": np.zeros(1, np.int32)})
    assert ints_to_floats["x"].dtype == np.float32
    from_lists = check_inputs(SIGNATURE, {"x": [[1.0, 2.0, 3.0]], "ids": [7]})
    assert from_lists["x"].dtype == np.float32 and from_lists["ids"].tolist() == [7]


@pytest.mark.parametrize(
    ("inputs", "message"),
    [
        ({"x": np.ones((2, 3), np.float32)}, r"missing input 'ids'; the model takes 'x', 'ids'"),
        ({**batch(), "z": np.ones(2)}, r"unexpected input 'z'; the model takes 'x', 'ids'"),
        ({**batch(), "x": np.ones((4, 2), np.float32)}, r"input 'x' must have shape \[-1, 3\], got \[4, 2\]"),
        ({**batch(), "x": np.ones((2, 3, 1), np.float32)}, r"input 'x' must have shape \[-1, 3\], got \[2, 3, 1\]"),
        ({**batch(), "ids": np.ones(2, np.float32)}, r"input 'ids' must be INT32, got FP32 \(which cannot be cast"),
        ({**batch(), "x": np.array([[b"a"] * 3] * 2, dtype=object)}, r"input 'x' must be FP32, got BYTES"),
        ({**batch(), "ids": np.array([1, 2**40])}, r"input 'ids' must be INT32; values 1\.\.1099511627776 do not fit"),
        ({"x": np.ones((2, 3), np.float32), "ids": np.arange(3, dtype=np.int32)}, r"same batch size .* x: 2, ids: 3"),
    ],
    ids=["missing", "unexpected", "trailing-dim", "rank", "float-to-int", "bytes", "overflow", "batch-sizes"],
)
def test_bad_inputs_are_bad_requests(inputs, message):
    with pytest.raises(BadRequest, match=message):
        check_inputs(SIGNATURE, inputs)


def test_bytes_inputs_and_unchecked_shapes():
    signature = Signature(inputs=(TensorSpec("text", "BYTES", ()),))
    words = np.array([b"a", b"bc"], dtype=object)
    assert check_inputs(signature, {"text": words})["text"] is words
    with pytest.raises(BadRequest, match="input 'text' must be BYTES, got FP32"):
        check_inputs(signature, {"text": np.ones(2, np.float32)})


def test_a_signature_without_inputs_checks_nothing():
    anything = {"whatever": np.ones(3)}
    assert check_inputs(Signature(outputs=(TensorSpec("y", "FP32", (-1,)),)), anything) == anything


def test_declared_names_must_match_the_model():
    inferred = Signature(inputs=(TensorSpec("a", "FP32", (-1, 2)), TensorSpec("b", "FP32", (-1,))))
    check_declared_names(Signature(inputs=(TensorSpec("b", "FP32", (-1,)), TensorSpec("a", "FP32", (8, 2)))), inferred)
    with pytest.raises(ValueError, match=r"leaves out the model's input\(s\) b"):
        check_declared_names(Signature(inputs=(TensorSpec("a", "FP32", (-1, 2)),)), inferred)
    with pytest.raises(ValueError, match=r"declared signature names output 'z', but the model's outputs are none"):
        check_declared_names(Signature(outputs=(TensorSpec("z", "FP32", (-1,)),)), inferred)
