"""Small helpers for trtspec's python-backend models: read request tensors, build response tensors.

Every bad request becomes a RequestError, which the models answer with an error response; nothing
a client sends can raise out of execute() and take the instance down.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np


class RequestError(ValueError):
    """A bad request: answered with an error response, never raised out of execute()."""


def error_response(model: object, exc: Exception):
    """A RequestError in its own words; anything else (a bug) logged in full and answered in one line."""
    import triton_python_backend_utils as pb_utils

    if isinstance(exc, RequestError):
        one_line = " ".join(line.strip() for line in str(exc).splitlines() if line.strip())
        return pb_utils.InferenceResponse(error=pb_utils.TritonError(one_line))
    import traceback

    pb_utils.Logger.log_error("".join(traceback.format_exception(exc)))
    message = f"internal error in {type(model).__name__}: {type(exc).__name__} (see the server log)"
    return pb_utils.InferenceResponse(error=pb_utils.TritonError(message))


class PythonModel:
    """execute() for models that answer each request with one response or, decoupled, a stream."""

    decoupled = False

    def execute(self, requests):
        import triton_python_backend_utils as pb_utils

        responses = []
        for request in requests:
            sender = request.get_response_sender() if self.decoupled else None
            try:
                final = self.answer(request, sender)
            except Exception as exc:
                final = error_response(self, exc)
            if sender is not None:
                sender.send(final, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            else:
                responses.append(final)
        return None if self.decoupled else responses

    def answer(self, request, sender):  # pragma: no cover - overridden
        raise NotImplementedError


class BatchedPythonModel:
    """execute() for models whose requests join a running batch (engine_loop): execute() only checks
    and submits each request, and every answer, a refusal included, goes through its response
    sender, which the python backend allows from any thread, decoupled or not."""

    def execute(self, requests):
        import triton_python_backend_utils as pb_utils

        for request in requests:
            sender = request.get_response_sender()
            try:
                self.submit(request, sender)
            except Exception as exc:
                sender.send(error_response(self, exc), flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None

    def submit(self, request, sender) -> None:  # pragma: no cover - overridden
        raise NotImplementedError


def given(request, name: str) -> bool:
    """Present with content: an empty string or array counts as not given, as NVIDIA's models read it."""
    import triton_python_backend_utils as pb_utils

    tensor = pb_utils.get_input_tensor_by_name(request, name)
    return tensor is not None and _has_content(tensor.as_numpy().reshape(-1))


def _has_content(values: np.ndarray) -> bool:
    return any(v not in (b"", "") for v in values.tolist()) if values.dtype == np.object_ else values.size > 0


def first_refused(request, declared: list[str], honoured: frozenset[str], neutral: dict[str, Any]) -> str | None:
    """The first declared input a request gives that the model neither honours nor finds at its no-op
    value, so nothing a client sends is accepted and then ignored."""
    present = {tensor.name(): tensor for tensor in request.inputs()}  # one pass, not a lookup per name
    for name in declared:
        if name in honoured or name not in present:
            continue
        values = present[name].as_numpy().reshape(-1)
        if not _has_content(values):
            continue
        if name in neutral and all(v == neutral[name] for v in values.tolist()):
            continue
        return name
    return None


def scalar(request, name: str, default: Any = None) -> Any:
    import triton_python_backend_utils as pb_utils

    tensor = pb_utils.get_input_tensor_by_name(request, name)
    if tensor is None:
        return default
    array = tensor.as_numpy()
    if array.size == 0:
        return default
    return array.reshape(-1)[0]


# The range every model gives temperature: 0 is greedy; above this the distribution is flat anyway.
MAX_TEMPERATURE = 100.0


def number(
    request,
    name: str,
    default: Any,
    low: float,
    high: float,
    *,
    integer: bool = False,
    open_low: bool = False,
    label: str | None = None,
) -> Any:
    """A numeric scalar input, `default` when absent; NaN, an infinity or a value outside [low, high]
    ((low, high] with open_low) is the client's error, answered in one line naming the input (as
    `label`, where the client knows it by another name) and the range it accepts."""
    raw = scalar(request, name)
    if raw is None:
        return default
    exact = isinstance(raw, (int, np.integer)) and not isinstance(raw, (bool, np.bool_))
    value = int(raw) if exact else float(raw)  # an integer compared exactly: 2**64 - 1 is a seed
    whole = exact or (math.isfinite(value) and value.is_integer())
    inside = (low < value if open_low else low <= value) and value <= high
    if not (math.isfinite(value) and inside and (whole or not integer)):
        kind = "an integer" if integer else "a number"
        bounds = f"{'(' if open_low else '['}{_plain(low)}, {_plain(high)}]"
        raise RequestError(f"{label or name} must be {kind} in {bounds}, got {_plain(raw)}")
    return int(value) if integer else float(value)


def _plain(value: Any) -> str:
    value = value.item() if isinstance(value, np.generic) else value
    return str(int(value)) if isinstance(value, float) and value.is_integer() else str(value)


def neutral_only(name: str, neutral: dict[str, Any]) -> str:
    """The one-line refusal of an input trtspec does not implement."""
    accepted = f" (only {neutral[name]!r} is accepted)" if name in neutral else ""
    return f"{name} is not supported by trtspec's torch engine{accepted}"


def decoded(value: Any, name: str) -> str:
    """A STRING tensor's element as text; bytes that are not UTF-8 are the client's error."""
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            raise RequestError(f"{name} is not valid UTF-8") from None
    return str(value)


def utf8(request, name: str) -> str | None:
    value = scalar(request, name)
    return None if value is None else decoded(value, name)


def string_tensor(name: str, value: str):
    import triton_python_backend_utils as pb_utils

    return pb_utils.Tensor(name, np.array([value.encode("utf-8")], dtype=np.object_))
