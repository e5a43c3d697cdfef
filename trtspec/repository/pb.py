"""Small helpers for trtspec's python-backend models: read request tensors, build response tensors.

Every bad request becomes a RequestError, which the models answer with an error response; nothing
a client sends can raise out of execute() and take the instance down.
"""

from __future__ import annotations

from typing import Any

import numpy as np


class RequestError(ValueError):
    """A bad request: answered with an error response, never raised out of execute()."""


def scalar(request, name: str, default: Any = None) -> Any:
    import triton_python_backend_utils as pb_utils

    tensor = pb_utils.get_input_tensor_by_name(request, name)
    if tensor is None:
        return default
    array = tensor.as_numpy()
    if array.size == 0:
        return default
    return array.reshape(-1)[0]


def utf8(request, name: str) -> str | None:
    value = scalar(request, name)
    if value is None:
        return None
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            raise RequestError(f"{name} is not valid UTF-8") from None
    return str(value)


def string_tensor(name: str, value: str):
    import triton_python_backend_utils as pb_utils

    return pb_utils.Tensor(name, np.array([value.encode("utf-8")], dtype=np.object_))
