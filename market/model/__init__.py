"""Model manifests, the embedded tiny model, and loading from local directories."""
