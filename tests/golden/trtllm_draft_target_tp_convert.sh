# same README, TP for the target is set at conversion (shared reference §1.1), verbatim
python3 convert_checkpoint.py \
    --model_dir=${TARGET_MODEL_PATH} \
    --output_dir=${TARGET_CKPT_PATH} \
    --dtype=float16 \
    --tp_size=2
