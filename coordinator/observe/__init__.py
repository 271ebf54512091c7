"""What an operator sees of a running coordinator: Prometheus metrics and a read-only fleet
dashboard with its JSON API, served from a thread beside the round loop (opt-in: ``[http]``)."""
