"""What runs on a Ray worker: models, data, the rope patch and the scorer (per-window NLL per candidate)."""
