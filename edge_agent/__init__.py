"""Edge agent: local data, models and training on a gateway; never imports the coordinator."""
