"""The number types and the strict section base every config section uses, the mode sections
(trtspec/modes) included: one definition of what a valid integer, port or fraction is."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field
from pydantic_core import PydanticCustomError


def _no_bool(kind: str, what: str) -> BeforeValidator:
    """YAML's true/false are not numbers: pydantic's lax mode would read `num_draft_tokens: true` as 1."""

    def check(value: Any) -> Any:
        if isinstance(value, bool):
            raise PydanticCustomError(kind, f"Input should be {what}")
        return value

    return BeforeValidator(check)


INT32_MAX = 2**31 - 1  # TensorRT-LLM's lengths and counts are int32
Int = Annotated[int, _no_bool("int_type", "a valid integer")]
Float = Annotated[float, _no_bool("float_type", "a valid number"), Field(allow_inf_nan=False)]
PositiveInt = Annotated[Int, Field(ge=1, le=INT32_MAX)]
Port = Annotated[Int, Field(ge=1, le=65535)]
Fraction = Annotated[Float, Field(gt=0.0, le=1.0)]  # (0, 1]


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=False, validate_default=True)
