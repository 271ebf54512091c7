"""edgefl: federated time-series forecasting on edge devices, with a neuromorphic export path."""

__version__ = "0.1.0"
