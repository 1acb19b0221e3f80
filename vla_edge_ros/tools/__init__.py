"""Tools built on the live core, never used by it: offline replay, closed-loop evaluation, the memory
benchmark and the parity check against transformers."""
