"""E2B's envd services, generated from proto/e2b/envd; never edit by hand (see proto/generate.py)."""
