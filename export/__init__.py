"""Neuromorphic export (ONNX, Lava netx, NIR) and operation counting; imports edge_agent only."""
