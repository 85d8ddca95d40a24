"""Container image tests and their fixtures (registry.py: an OCI registry on loopback)."""
