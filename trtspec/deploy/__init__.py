"""`trtspec deploy`: Docker images and Kubernetes manifests for a config's model repository."""
