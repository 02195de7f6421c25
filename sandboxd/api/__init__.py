"""gRPC layer: servicers translate proto to domain calls and back; nothing else."""
