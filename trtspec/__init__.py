"""trtspec: speculative decoding from a checkpoint pair to a served, load-tested deployment."""

__version__ = "0.1.0"
