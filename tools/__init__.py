"""Helpers outside the product: the separate Lava venv (``tools/lava``) and this site's generators."""
