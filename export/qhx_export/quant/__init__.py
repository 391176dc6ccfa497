"""Quantization: the calibration corpus, calibration and QDQ graphs with per-channel weights."""
