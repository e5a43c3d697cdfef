"""TensorRT-LLM releases trtspec generates for, and the Triton container that carries each.

Source: Triton's compatibility table
(https://github.com/triton-inference-server/server/blob/main/docs/introduction/compatibility.md).
A container runs only engines built by its own TensorRT-LLM, so the tag follows the version.
Compiled engines (trtllm-build) exist up to 1.2.x; 1.3 removed them.
"""

from __future__ import annotations

# TensorRT-LLM version -> Triton `<yy.mm>-trtllm-python-py3` releases that ship it, oldest first.
TRTLLM_CONTAINERS: dict[str, tuple[str, ...]] = {
    "1.0.0": ("25.09", "25.10"),
    "1.0.3": ("25.11",),
    "1.1.0": ("25.12", "26.01", "26.02"),
    "1.2.0": ("26.03",),
    "1.2.1": ("26.04", "26.05", "26.06", "26.07"),
}

DEFAULT_TRTLLM_VERSION = "1.2.1"


def minor(version: str) -> str:
    """'1.2.1' -> '1.2': schemas and field names change by minor release."""
    return ".".join(version.split(".")[:2])


def release(version: str) -> tuple[int, ...]:
    """'1.2.1' -> (1, 2, 1), so that 1.10 sorts after 1.2 (strings do not)."""
    return tuple(int(part) for part in version.split("."))


def at_least(version: str, floor: str) -> bool:
    """Whether `version` ('1.2.1') is `floor` ('1.2') or newer, compared release by release."""
    return release(version)[: len(release(floor))] >= release(floor)


def supported_minors() -> tuple[str, ...]:
    """The minor releases trtspec generates for ('1.0', '1.1', '1.2'), from the container table."""
    return tuple(dict.fromkeys(minor(v) for v in TRTLLM_CONTAINERS))


def engine_minors() -> tuple[str, ...]:
    """The minor releases that still build compiled engines (trtllm-build): 1.3 removed them."""
    return tuple(v for v in supported_minors() if not at_least(v, "1.3"))


def container_tag(version: str) -> str:
    """The newest Triton release carrying this TensorRT-LLM version (later ones carry fixes)."""
    return TRTLLM_CONTAINERS[version][-1]


def container_image(version: str) -> str:
    return f"nvcr.io/nvidia/tritonserver:{container_tag(version)}-trtllm-python-py3"
