"""The scheduler role: the scheduler, its KV cache manager (block_manager), the
requests it owns, the stop rule, the data-parallel balancer, and the plain data it
exchanges with the workers each step (output)."""
