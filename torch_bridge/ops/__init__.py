"""ATen -> JAX lowerings, one module per op family; ``registry`` holds the table."""
