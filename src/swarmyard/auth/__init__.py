"""Capability tokens for workers and the operator: below both the control plane and the broker, which verify them."""
