"""Forecasts out of a live gateway (issue 15, step 3): after every accepted round the agent writes
its served model as a verified ONNX bundle (``bundle``, torch side), and forecasts are computed
from that bundle with ONNX Runtime and numpy alone (``onnx_serving``, no torch, no pandas) and
published on a local topic on a schedule."""
