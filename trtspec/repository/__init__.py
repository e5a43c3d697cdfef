"""Triton model repositories: typed configs, flavours, and trtspec's python models."""
