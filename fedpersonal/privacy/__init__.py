"""Privacy analysis of federated computations."""
