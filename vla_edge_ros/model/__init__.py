"""The Qwen2-family VLA engine: checkpoint loading, backends, KV arena, frame encoder, action head."""
