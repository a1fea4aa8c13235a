"""dflash-serve: Triton Inference Server deployments of engine directories."""
