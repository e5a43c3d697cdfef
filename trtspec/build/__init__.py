"""Engine builds: TensorRT-LLM's compiled engines and LLM API options, and trtspec's torch engines."""
