"""Generated protobuf and gRPC stubs; never edit by hand (see proto/generate.py)."""
