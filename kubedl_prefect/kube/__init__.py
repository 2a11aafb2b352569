"""The Kubernetes layer: client, shared watches, log streams, all on one process-wide loop."""
