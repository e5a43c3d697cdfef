# same README (https://github.com/NVIDIA/TensorRT-LLM/blob/567239fcd40bda119965a3a8abf43856c63c9527/examples/draft_target_model/README.md), TP for the target is set at conversion, verbatim
python3 convert_checkpoint.py \
    --model_dir=${TARGET_MODEL_PATH} \
    --output_dir=${TARGET_CKPT_PATH} \
    --dtype=float16 \
    --tp_size=2
