"""Generators of the documentation site's reference pages (configuration, command line, layout)
and of the runnable tutorial commands' checks."""
