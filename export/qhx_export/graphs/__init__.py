"""ONNX graphs shared by every family (qhx_export.graphs.decoder) and the builder under them."""

from qhx_export.graphs.decoder import GraphOptions, layer_graph, lmhead_graph, save, specs

__all__ = ["GraphOptions", "layer_graph", "lmhead_graph", "save", "specs"]
