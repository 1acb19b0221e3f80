"""Host-side numerics below everything else: the NumPy transformer math and bf16 conversion."""
