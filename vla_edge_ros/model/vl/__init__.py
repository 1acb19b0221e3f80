"""Qwen2-VL and Qwen2.5-VL: what a vision-language checkpoint adds to the text decoder.

``config`` (the vision tower's config.json section and M-RoPE), ``preprocess`` (images to patches as
transformers' processor makes them), ``vision`` and ``cuda_vision`` (the tower in NumPy and in the CUDA
kernels), ``tower`` (the one on the engine's backend), ``positions`` (M-RoPE ids as ``get_rope_index``
places them), ``prompt`` (a prompt with images as decoder inputs) and ``frames`` (a camera frame as one
image segment of the runtime). The text decoder, its backends and the KV arena are the parent package's.
"""
