"""Synthetic worlds, pure NumPy: the memory benchmark's cue scenes, a moving camera scene, the 2-D robot world."""
