"""Reading and comparing checkpoints and tokenizers without loading weights."""
