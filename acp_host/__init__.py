"""A reusable trio ACP host library. Knows nothing of kilns or cards."""
