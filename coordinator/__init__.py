"""Coordinator: rounds, aggregation and the in-process simulation of a fleet."""
