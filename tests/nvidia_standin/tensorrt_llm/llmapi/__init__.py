from tensorrt_llm.llmapi.llm import LLM, RequestOutput, SamplingParams


class MpiCommSession:
    def __init__(self, *args, **kwargs) -> None:
        raise RuntimeError("the stand-in runs in one process: no MPI session")


__all__ = ["LLM", "MpiCommSession", "RequestOutput", "SamplingParams"]
