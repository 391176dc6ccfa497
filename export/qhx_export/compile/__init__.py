"""Compiling graphs for the Hexagon NPU (QNN HTP context binaries)."""
